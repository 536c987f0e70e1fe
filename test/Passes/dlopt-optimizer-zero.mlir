// RUN: dlopt-opt %s --split-input-file --dlopt-autodiff --dlopt-partition="axes=dp sizes=2" --dlopt-optimizer="optimizer=sgd momentum=0.9 clip-norm=1 zero=1" | FileCheck %s --check-prefix=ZERO1
// RUN: dlopt-opt %s --split-input-file --dlopt-autodiff --dlopt-partition="axes=dp sizes=2" --dlopt-optimizer="optimizer=adamw zero=3 accumulate=2" | FileCheck %s --check-prefix=ZERO3

// ZeRO-1: w (4x3) is sharded on dim 0 over dp; b (3) has no dim that
// divides by 2 and keeps whole state. w's gradient all-reduce becomes a
// reduce-scatter; the update runs on this rank's rows of w and is gathered.
// ZERO1-LABEL: func.func @main
// ZERO1-SAME: %[[W:[a-z0-9]+]]: tensor<4x3xf32> {dlopt.param = "w"}
// ZERO1-SAME: %[[MW:[a-z0-9]+]]: tensor<2x3xf32> {dlopt.global_type = tensor<4x3xf32>, dlopt.split = {{\[}}["dp"], []], dlopt.state = "sgd.momentum.w"}
// ZERO1-SAME: %{{.+}}: tensor<3xf32> {dlopt.state = "sgd.momentum.b"}
// ZERO1-SAME: tensor<4x3xf32> {dlopt.output = "w", dlopt.update = "w"}
// ZERO1-SAME: tensor<2x3xf32> {dlopt.global_type = tensor<4x3xf32>, dlopt.output = "sgd.momentum.w", dlopt.split = {{\[}}["dp"], []], dlopt.update = "sgd.momentum.w"}
// ZERO1: %[[GB:.+]] = shard.all_reduce %{{.+}} on @dlopt_mesh grid_axes = [0]{{( \{[^}]*\})?}} : tensor<3xf32> -> tensor<3xf32>
// ZERO1: %[[GW:.+]] = dlopt.matmul %{{.+}} {dlopt.backward, transpose_a} : tensor<4x4xf32>, tensor<4x3xf32> -> tensor<4x3xf32>
// ZERO1-NEXT: %[[RS:.+]] = shard.reduce_scatter %[[GW]] on @dlopt_mesh grid_axes = [0] scatter_axis = 0{{( \{[^}]*\})?}} : tensor<4x3xf32> -> tensor<2x3xf32>
// The clipping norm sums the shard's squares over dp.
// ZERO1: %[[ABS:.+]] = dlopt.abs %[[RS]]
// ZERO1: %[[SQ:.+]] = dlopt.mul %[[ABS]], %[[ABS]]
// ZERO1: %[[SS:.+]] = dlopt.sum %[[SQ]]
// ZERO1: shard.all_reduce %[[SS]] on @dlopt_mesh grid_axes = [0]{{( \{[^}]*\})?}} : tensor<f32> -> tensor<f32>
// ZERO1: %[[WS:.+]] = shard.all_slice %[[W]] on @dlopt_mesh grid_axes = [0] slice_axis = 0{{( \{[^}]*\})?}} : tensor<4x3xf32> -> tensor<2x3xf32>
// ZERO1: %[[NEWW:.+]] = dlopt.sub %[[WS]], %{{.+}} : tensor<2x3xf32>
// ZERO1: %[[AG:.+]] = shard.all_gather %[[NEWW]] on @dlopt_mesh grid_axes = [0] gather_axis = 0{{( \{[^}]*\})?}} : tensor<2x3xf32> -> tensor<4x3xf32>
// ZERO1: return %{{.+}}, %{{.+}}, %{{.+}}, %[[AG]], %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}} : tensor<f32>, tensor<f32>, tensor<f32>, tensor<4x3xf32>, tensor<3xf32>, tensor<2x3xf32>, tensor<3xf32>, tensor<i64>

// ZeRO-3 with two micro-batches: w is stored as its shard and gathered
// before its first forward use and before its first backward use, per
// micro-batch (the marks keep CSE from merging them); every micro-batch's
// gradient is reduce-scattered and the shards are accumulated; the update
// stays a shard.
// ZERO3-LABEL: func.func @main
// ZERO3-SAME: %[[W:[a-z0-9]+]]: tensor<2x3xf32> {dlopt.global_type = tensor<4x3xf32>, dlopt.param = "w", dlopt.split = {{\[}}["dp"], []]}
// ZERO3-SAME: tensor<2x3xf32> {dlopt.global_type = tensor<4x3xf32>, dlopt.split = {{\[}}["dp"], []], dlopt.state = "adamw.m.w"}
// ZERO3-SAME: tensor<2x3xf32> {dlopt.global_type = tensor<4x3xf32>, dlopt.output = "w", dlopt.split = {{\[}}["dp"], []], dlopt.update = "w"}
// ZERO3: %[[F0:.+]] = shard.all_gather %[[W]] on @dlopt_mesh grid_axes = [0] gather_axis = 0 {dlopt.mb = 0 : i64, dlopt.zero_gather = "fwd.mb0"} : tensor<2x3xf32> -> tensor<4x3xf32>
// ZERO3-NEXT: dlopt.matmul %{{.+}}, %[[F0]] {dlopt.mb = 0 : i64}
// ZERO3: %[[B0:.+]] = shard.all_gather %[[W]] on @dlopt_mesh grid_axes = [0] gather_axis = 0 {dlopt.backward, dlopt.mb = 0 : i64, dlopt.zero_gather = "bwd.mb0"}
// ZERO3-NEXT: dlopt.matmul %{{.+}}, %[[B0]] {dlopt.backward, dlopt.mb = 0 : i64, transpose_b}
// ZERO3: %[[R0:.+]] = shard.reduce_scatter %{{.+}} on @dlopt_mesh grid_axes = [0] scatter_axis = 0 {dlopt.backward, dlopt.mb = 0 : i64} : tensor<4x3xf32> -> tensor<2x3xf32>
// ZERO3: shard.all_gather %[[W]] {{.+}} {dlopt.mb = 1 : i64, dlopt.zero_gather = "fwd.mb1"}
// ZERO3: shard.all_gather %[[W]] {{.+}} {dlopt.backward, dlopt.mb = 1 : i64, dlopt.zero_gather = "bwd.mb1"}
// ZERO3: %[[R1:.+]] = shard.reduce_scatter %{{.+}} {dlopt.backward, dlopt.mb = 1 : i64} : tensor<4x3xf32> -> tensor<2x3xf32>
// ZERO3: dlopt.add %[[R0]], %[[R1]] {dlopt.accumulate = 1 : i64} : tensor<2x3xf32>, tensor<2x3xf32> -> tensor<2x3xf32>
// ZERO3-NOT: shard.all_gather
// ZERO3: return
func.func @main(%x: tensor<8x4xf32> {dlopt.input = "x"},
                %w: tensor<4x3xf32> {dlopt.param = "w"},
                %b: tensor<3xf32> {dlopt.param = "b"},
                %t: tensor<8x3xf32> {dlopt.input = "t"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %h = dlopt.matmul %x, %w : tensor<8x4xf32>, tensor<4x3xf32> -> tensor<8x3xf32>
  %hb = dlopt.add %h, %b : tensor<8x3xf32>, tensor<3xf32> -> tensor<8x3xf32>
  %l = dlopt.mse %hb, %t : tensor<8x3xf32>, tensor<8x3xf32> -> tensor<f32>
  return %l : tensor<f32>
}
