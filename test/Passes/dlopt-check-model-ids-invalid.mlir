// RUN: dlopt-opt %s --split-input-file --dlopt-check-model --verify-diagnostics

func.func @main(%x: tensor<4xf32> {dlopt.input = "x"}) -> tensor<4xf32> {
  // expected-note @+1 {{first used here}}
  %a = dlopt.relu %x {dlopt.id = 3 : i64} : tensor<4xf32>
  // expected-error @+1 {{op id 3 (dlopt.id) is already used}}
  %b = dlopt.neg %a {dlopt.id = 3 : i64} : tensor<4xf32>
  return %b : tensor<4xf32>
}

// -----

func.func @main(%x: tensor<4xf32> {dlopt.input = "x"}) -> tensor<4xf32> {
  // expected-error @+1 {{'dlopt.id' expects a non-negative integer, got -1 : i64}}
  %a = dlopt.relu %x {dlopt.id = -1 : i64} : tensor<4xf32>
  return %a : tensor<4xf32>
}
