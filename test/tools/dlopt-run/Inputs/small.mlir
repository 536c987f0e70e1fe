func.func @main(%x: tensor<4x8xf32> {dlopt.input = "x"},
                %w: tensor<8x3xf32> {dlopt.param = "w", dlopt.init = {dist = "normal", std = 0.5}})
    -> (tensor<3xf32> {dlopt.output = "colsum"}) {
  %h = dlopt.matmul %x, %w : tensor<4x8xf32>, tensor<8x3xf32> -> tensor<4x3xf32>
  %p = dlopt.softmax %h dim = -1 : tensor<4x3xf32>
  %s = dlopt.sum %p dims = [-2] : tensor<4x3xf32> -> tensor<3xf32>
  return %s : tensor<3xf32>
}
