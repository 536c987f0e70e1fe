// RUN: dlopt-opt %s --split-input-file --verify-diagnostics | FileCheck %s

// CHECK-LABEL: func.func @exchange
// CHECK: %[[G:.+]] = dlopt.send_recv %{{.+}} to [1] from [1] over "pp" : (tensor<2xf32>) -> tensor<2xf32>
// CHECK: dlopt.send_recv %{{.+}} to [0] from [] over "pp" : (tensor<f32>) -> ()
func.func @exchange(%a: tensor<2xf32>, %l: tensor<f32>) -> tensor<2xf32> {
  %g = dlopt.send_recv %a to [1] from [1] over "pp" : (tensor<2xf32>) -> tensor<2xf32>
  dlopt.send_recv %l to [0] from [] over "pp" : (tensor<f32>) -> ()
  return %g : tensor<2xf32>
}

// -----

func.func @counts(%a: tensor<2xf32>) {
  // expected-error @+1 {{expects one 'to' coordinate per sent tensor: 1 tensors, 2 coordinates}}
  dlopt.send_recv %a to [1, 0] from [] over "pp" : (tensor<2xf32>) -> ()
  return
}

// -----

func.func @empty() {
  // expected-error @+1 {{expects at least one tensor to send or receive}}
  dlopt.send_recv to [] from [] over "pp" : () -> ()
  return
}

// -----

func.func @negative() -> tensor<2xf32> {
  // expected-error @+1 {{expects 'from' coordinates >= 0, got -1}}
  %r = dlopt.send_recv to [] from [-1] over "pp" : () -> tensor<2xf32>
  return %r : tensor<2xf32>
}
