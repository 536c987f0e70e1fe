// RUN: dlopt-opt %s --dlopt-check-model | FileCheck %s --check-prefix=STAMP

// Ids already present are kept; ops without one get the next free ids.
// STAMP-LABEL: func @partial
// STAMP: dlopt.relu {{.*}}{dlopt.id = 7 : i64}
// STAMP: dlopt.neg {{.*}}{dlopt.id = 8 : i64}
// STAMP: dlopt.exp {{.*}}{dlopt.fwd_id = 7 : i64}
func.func @partial(%x: tensor<4xf32> {dlopt.input = "x"}) -> tensor<4xf32> {
  %a = dlopt.relu %x {dlopt.id = 7 : i64} : tensor<4xf32>
  %b = dlopt.neg %a : tensor<4xf32>
  %c = dlopt.exp %b {dlopt.fwd_id = 7 : i64} : tensor<4xf32>
  return %c : tensor<4xf32>
}
