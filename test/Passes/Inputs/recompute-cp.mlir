func.func @main(%x: tensor<1x2x8x8xf32> {dlopt.input = "x", dlopt.sharding = [[], [], ["cp"], []]},
                %wk: tensor<8x8xf32> {dlopt.param = "wk"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %k = dlopt.matmul %x, %wk {dlopt.layer = 0 : i64} : tensor<1x2x8x8xf32>, tensor<8x8xf32> -> tensor<1x2x8x8xf32>
  %o = dlopt.attention %x, %k, %k {causal, dlopt.layer = 0 : i64} : tensor<1x2x8x8xf32>, tensor<1x2x8x8xf32>, tensor<1x2x8x8xf32> -> tensor<1x2x8x8xf32>
  %sq = dlopt.mul %o, %o : tensor<1x2x8x8xf32>, tensor<1x2x8x8xf32> -> tensor<1x2x8x8xf32>
  %l = dlopt.sum %sq dims = [0, 1, 2, 3] : tensor<1x2x8x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}
