// RUN: dlopt-opt %s --split-input-file --dlopt-check-model --verify-diagnostics | FileCheck %s

// CHECK-LABEL: func @main
func.func @main(%x: tensor<4x4xf32> {dlopt.input = "x"},
                %w: tensor<4x4xf32> {dlopt.param = "w"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %0 = dlopt.mse %x, %w : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<f32>
  return %0 : tensor<f32>
}

// -----

// expected-error @+1 {{argument #1 ('tensor<4x4xf32>') is neither a dlopt.param nor a dlopt.input}}
func.func @main(%x: tensor<4x4xf32> {dlopt.input = "x"}, %w: tensor<4x4xf32>) -> tensor<4x4xf32> {
  return %x : tensor<4x4xf32>
}

// -----

// expected-error @+1 {{argument #1 uses the name 'x' which is already taken}}
func.func @main(%x: tensor<4x4xf32> {dlopt.input = "x"}, %w: tensor<4x4xf32> {dlopt.param = "x"}) -> tensor<4x4xf32> {
  return %x : tensor<4x4xf32>
}

// -----

// expected-error @+1 {{is marked dlopt.loss, so the first result must be a rank-0 float tensor, got 'tensor<4x4xf32>'}}
func.func @main(%x: tensor<4x4xf32> {dlopt.input = "x"}) -> tensor<4x4xf32> attributes {dlopt.loss} {
  return %x : tensor<4x4xf32>
}

// -----

// expected-error @+1 {{argument #0 is a dlopt.param of type 'tensor<4xi32>', expected a float tensor}}
func.func @main(%w: tensor<4xi32> {dlopt.param = "w"}) -> tensor<4xi32> {
  return %w : tensor<4xi32>
}

// -----

// expected-error @+1 {{argument #0 has a dlopt.init but is not a dlopt.param}}
func.func @main(%x: tensor<4xf32> {dlopt.input = "x", dlopt.init = {dist = "ones"}}) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}

// -----

func.func @main(%x: tensor<4xf32> {dlopt.input = "x"}) -> tensor<4xf32> {
  // expected-error @+1 {{op 'arith.addf' is not supported in a dlopt model; expected dlopt ops, arith.constant and func.return}}
  %0 = arith.addf %x, %x : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// expected-error @+1 {{expects a function @main or exactly one public function as the model entry, found 2 public functions}}
module {
  func.func @a(%x: tensor<4xf32> {dlopt.input = "x"}) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
  func.func @b(%x: tensor<4xf32> {dlopt.input = "x"}) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
}

// -----

// expected-error @+1 {{result #1 uses the output name 'y' which is already taken}}
func.func @main(%x: tensor<4xf32> {dlopt.input = "x"}) -> (tensor<4xf32> {dlopt.output = "y"}, tensor<4xf32> {dlopt.output = "y"}) {
  return %x, %x : tensor<4xf32>, tensor<4xf32>
}
