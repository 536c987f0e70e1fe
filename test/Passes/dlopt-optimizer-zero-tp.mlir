// RUN: dlopt-opt %s --dlopt-autodiff --dlopt-partition="axes=dp,tp sizes=2,2" --dlopt-optimizer="optimizer=sgd zero=2 bucket-mb=0" | FileCheck %s

// (bucket-mb=0: one reduce-scatter per gradient; dlopt-optimizer-zero-buckets.mlir
// covers buckets.)

// ZeRO-2 on a dp x tp mesh. v is replicated over tp: its gradient is a sum
// over dp and tp, which becomes a reduce-scatter over dp and an all-reduce
// of the shard over tp. w is column-parallel over tp: it is sharded on its
// rows over dp (split [dp] x [tp]); its gradient, built whole by this toy
// and sliced over tp first, is reduce-scattered over dp.
// CHECK-LABEL: func.func @main
// CHECK: %[[SL:.+]] = shard.all_slice %{{.+}} on @dlopt_mesh grid_axes = [1] slice_axis = 1{{( \{[^}]*\})?}} : tensor<4x6xf32> -> tensor<4x3xf32>
// CHECK-NEXT: %[[GW:.+]] = shard.reduce_scatter %[[SL]] on @dlopt_mesh grid_axes = [0] scatter_axis = 0{{( \{[^}]*\})?}} : tensor<4x3xf32> -> tensor<2x3xf32>
// CHECK: %[[RV:.+]] = shard.reduce_scatter %{{.+}} on @dlopt_mesh grid_axes = [0] scatter_axis = 0{{( \{[^}]*\})?}} : tensor<4xf32> -> tensor<2xf32>
// CHECK-NEXT: %[[GV:.+]] = shard.all_reduce %[[RV]] on @dlopt_mesh grid_axes = [1]{{( \{[^}]*\})?}} : tensor<2xf32> -> tensor<2xf32>
// CHECK: %[[VS:.+]] = shard.all_slice %{{.+}} on @dlopt_mesh grid_axes = [0] slice_axis = 0{{( \{[^}]*\})?}} : tensor<4xf32> -> tensor<2xf32>
// CHECK: shard.all_gather %{{.+}} on @dlopt_mesh grid_axes = [0] gather_axis = 0{{( \{[^}]*\})?}} : tensor<2xf32> -> tensor<4xf32>
// CHECK: shard.all_slice %{{.+}} on @dlopt_mesh grid_axes = [0] slice_axis = 0{{( \{[^}]*\})?}} : tensor<4x3xf32> -> tensor<2x3xf32>
// CHECK: shard.all_gather %{{.+}} on @dlopt_mesh grid_axes = [0] gather_axis = 0{{( \{[^}]*\})?}} : tensor<2x3xf32> -> tensor<4x3xf32>
func.func @main(%x: tensor<8x4xf32> {dlopt.input = "x"},
                %v: tensor<4xf32> {dlopt.param = "v"},
                %w: tensor<4x6xf32> {dlopt.param = "w", dlopt.sharding = [[], ["tp"]]})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %s = dlopt.mul %x, %v : tensor<8x4xf32>, tensor<4xf32> -> tensor<8x4xf32>
  %h = dlopt.matmul %s, %w : tensor<8x4xf32>, tensor<4x6xf32> -> tensor<8x6xf32>
  %l = dlopt.sum %h dims = [0, 1] : tensor<8x6xf32> -> tensor<f32>
  return %l : tensor<f32>
}
