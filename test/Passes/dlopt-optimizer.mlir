// RUN: dlopt-opt %s --split-input-file --dlopt-autodiff --dlopt-optimizer="optimizer=adamw lr=0.01 weight-decay=0.1" | FileCheck %s --check-prefix=ADAMW
// RUN: dlopt-opt %s --split-input-file --dlopt-autodiff --dlopt-optimizer="optimizer=sgd lr=0.1 momentum=0.9 nesterov=true clip-norm=1.0" | FileCheck %s --check-prefix=SGD
// RUN: dlopt-opt %s --split-input-file --dlopt-autodiff --dlopt-optimizer="optimizer=adam schedule=cosine warmup-steps=10 total-steps=100 min-lr=1e-5 accumulate=2" | FileCheck %s --check-prefix=ACC

// ADAMW-LABEL: func @main
// ADAMW-SAME: %[[W:[a-z0-9]+]]: tensor<4x3xf32> {dlopt.param = "w"}
// ADAMW-SAME: %[[STEP:[a-z0-9]+]]: tensor<i64> {dlopt.state = "step"}
// ADAMW-SAME: %[[M:[a-z0-9]+]]: tensor<4x3xf32> {dlopt.state = "adamw.m.w"}
// ADAMW-SAME: %[[V:[a-z0-9]+]]: tensor<4x3xf32> {dlopt.state = "adamw.v.w"}
// ADAMW-SAME: -> (tensor<f32> {dlopt.output = "loss"}, tensor<f32> {dlopt.output = "lr"}, tensor<f32> {dlopt.output = "grad_norm"},
// ADAMW-SAME: tensor<4x3xf32> {dlopt.output = "w", dlopt.update = "w"},
// ADAMW-SAME: tensor<4x3xf32> {dlopt.output = "adamw.m.w", dlopt.update = "adamw.m.w"},
// ADAMW-SAME: tensor<4x3xf32> {dlopt.output = "adamw.v.w", dlopt.update = "adamw.v.w"},
// ADAMW-SAME: tensor<i64> {dlopt.output = "step", dlopt.update = "step"})
// ADAMW-SAME: attributes {dlopt.loss, dlopt.train_step}
// ADAMW: dlopt.add %[[STEP]]
// Bias corrections 1/(1 - beta^t) = (T - 1) / 2T, T = tanh(t ln(beta) / 2):
// ln(0.9)/2 and ln(0.999)/2 in double, then rounded to f32.
// ADAMW: arith.constant dense<-0.0526802577> : tensor<f32>
// ADAMW: dlopt.tanh
// ADAMW: arith.constant dense<-5.00250142E-4> : tensor<f32>
// ADAMW: dlopt.tanh
// ADAMW: dlopt.sqrt
// ADAMW: arith.constant dense<1.000000e-01> : tensor<f32>

// SGD-LABEL: func @main
// SGD-SAME: {dlopt.state = "sgd.momentum.w"}
// SGD-NOT: dlopt.state = "adam
// SGD: dlopt.minimum
// SGD: return

// ACC-LABEL: func @main
// ACC-SAME: %{{.+}}: tensor<2x8x4xf32> {dlopt.input = "x"}
// ACC-SAME: tensor<2x8x3xf32> {dlopt.input = "t"}
// ACC-SAME: {dlopt.state = "adam.m.w"}
// ACC: dlopt.slice %{{.+}} start = [0, 0, 0] limit = [1, 8, 4] stride = [1, 1, 1]
// ACC: dlopt.slice %{{.+}} start = [1, 0, 0] limit = [2, 8, 4] stride = [1, 1, 1]
// ACC: dlopt.cos
// ACC: dlopt.select
func.func @main(%x: tensor<8x4xf32> {dlopt.input = "x"},
                %w: tensor<4x3xf32> {dlopt.param = "w"},
                %t: tensor<8x3xf32> {dlopt.input = "t"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %h = dlopt.matmul %x, %w : tensor<8x4xf32>, tensor<4x3xf32> -> tensor<8x3xf32>
  %l = dlopt.mse %h, %t : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Every dropout (the forward one and its gradient) takes the step counter as
// its offset, so each step draws a new mask that both passes share.
// ADAMW-LABEL: func @dropout
// ADAMW-SAME: %[[STEP:[a-z0-9]+]]: tensor<i64> {dlopt.state = "step"}
// ADAMW: dlopt.dropout %{{.+}} offset(%[[STEP]] : tensor<i64>) {{{.*}}rate = 5.000000e-01 : f64, seed = 3 : i64} : tensor<8x3xf32>
// ADAMW: dlopt.dropout %{{.+}} offset(%[[STEP]] : tensor<i64>) {{{.*}}rate = 5.000000e-01 : f64, seed = 3 : i64} : tensor<8x3xf32>
// ADAMW-NOT: dlopt.dropout
// ADAMW: return

// SGD-LABEL: func @dropout
// SGD-SAME: %[[STEP:[a-z0-9]+]]: tensor<i64> {dlopt.state = "step"}
// SGD-COUNT-2: dlopt.dropout %{{.+}} offset(%[[STEP]] : tensor<i64>)
// SGD-NOT: dlopt.dropout
// SGD: return

// With accumulation every micro-batch's dropouts read the step as well.
// ACC-LABEL: func @dropout
// ACC-SAME: %[[STEP:[a-z0-9]+]]: tensor<i64> {dlopt.state = "step"}
// ACC-COUNT-4: dlopt.dropout %{{.+}} offset(%[[STEP]] : tensor<i64>)
// ACC-NOT: dlopt.dropout
// ACC: return
func.func @dropout(%x: tensor<8x4xf32> {dlopt.input = "x"},
                   %w: tensor<4x3xf32> {dlopt.param = "w"},
                   %t: tensor<8x3xf32> {dlopt.input = "t"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %h = dlopt.matmul %x, %w : tensor<8x4xf32>, tensor<4x3xf32> -> tensor<8x3xf32>
  %d = dlopt.dropout %h {rate = 0.5, seed = 3} : tensor<8x3xf32>
  %l = dlopt.mse %d, %t : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<f32>
  return %l : tensor<f32>
}
