// RUN: dlopt-opt %s --split-input-file --dlopt-autodiff --dlopt-partition="axes=dp sizes=2" --dlopt-optimizer="optimizer=sgd zero=2 accumulate=2" | FileCheck %s --check-prefix=ZERO2
// RUN: dlopt-opt %s --split-input-file --dlopt-autodiff --dlopt-partition="axes=dp sizes=2" --dlopt-optimizer="optimizer=sgd zero=3" --dlopt-recompute="policy=full" | FileCheck %s --check-prefix=ZERO3
// RUN: dlopt-opt %s --split-input-file --dlopt-autodiff --dlopt-partition="axes=dp sizes=2" --dlopt-optimizer="optimizer=sgd zero=2 bucket-mb=0" | FileCheck %s --check-prefix=NONE

// ZeRO's collectives in buckets. Every parameter shards on dim 0 over dp=2.
//
// ZeRO-2 with two micro-batches: each micro-batch's four gradients are
// reduce-scattered as one bucket, in backward order (d, v, c, w), at the
// last of them. Each gradient is viewed as [2, n/2] rows (its two dim-0
// blocks), the rows are concatenated, and row r of the sum is rank r's
// block of every gradient.
// ZERO2-LABEL: func.func @main
// ZERO2: %[[CAT:.+]] = dlopt.concat %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}} dim = 1 {dlopt.backward, dlopt.layer = 0 : i64, dlopt.mb = 0 : i64} : tensor<2x1xf32>, tensor<2x4xf32>, tensor<2x2xf32>, tensor<2x8xf32> -> tensor<2x15xf32>
// ZERO2-NEXT: %[[RS:.+]] = shard.reduce_scatter %[[CAT]] on @dlopt_mesh grid_axes = [0] scatter_axis = 0 {dlopt.backward, dlopt.layer = 0 : i64, dlopt.mb = 0 : i64} : tensor<2x15xf32> -> tensor<1x15xf32>
// ZERO2-NEXT: %[[D:.+]] = dlopt.slice %[[RS]] start = [0, 0] limit = [1, 1]
// ZERO2-NEXT: dlopt.reshape %[[D]] {{.+}} : tensor<1x1xf32> -> tensor<1xf32>
// ZERO2: %[[W:.+]] = dlopt.slice %[[RS]] start = [0, 7] limit = [1, 15]
// ZERO2-NEXT: dlopt.reshape %[[W]] {{.+}} : tensor<1x8xf32> -> tensor<2x4xf32>
// ZERO2: shard.reduce_scatter {{.+}} {dlopt.backward, dlopt.layer = 0 : i64, dlopt.mb = 1 : i64} : tensor<2x15xf32> -> tensor<1x15xf32>
// ZERO2-NOT: shard.reduce_scatter
// The updated shards are gathered as one bucket: row r of the gather is
// rank r's block of every parameter.
// ZERO2: %[[UCAT:.+]] = dlopt.concat {{.+}} dim = 1 : tensor<1x8xf32>, tensor<1x2xf32>, tensor<1x4xf32>, tensor<1x1xf32> -> tensor<1x15xf32>
// ZERO2-NEXT: %[[AG:.+]] = shard.all_gather %[[UCAT]] on @dlopt_mesh grid_axes = [0] gather_axis = 0 : tensor<1x15xf32> -> tensor<2x15xf32>
// ZERO2-NEXT: %[[UW:.+]] = dlopt.slice %[[AG]] start = [0, 0] limit = [2, 8] stride = [1, 1] : tensor<2x15xf32> -> tensor<2x8xf32>
// ZERO2-NEXT: dlopt.reshape %[[UW]] : tensor<2x8xf32> -> tensor<4x4xf32>
// ZERO2-NOT: shard.all_gather
// ZERO2: return

// ZeRO-3 with full recomputation: each layer's parameters are gathered as
// one bucket before the layer's forward (layer 0: w and c). The backward
// pass needs only the weights; layer 0's comes from the recomputed
// forward's bucket, so nothing is gathered a third time.
// ZERO3-LABEL: func.func @main
// ZERO3: %[[G0:.+]] = shard.all_gather %{{.+}} {dlopt.layer = 0 : i64, dlopt.zero_gather = "fwd"} : tensor<1x10xf32> -> tensor<2x10xf32>
// ZERO3: %[[G1:.+]] = shard.all_gather %{{.+}} {dlopt.layer = 1 : i64, dlopt.zero_gather = "fwd"} : tensor<1x5xf32> -> tensor<2x5xf32>
// Layer 1 is not recomputed (its backward follows it): it gathers v again.
// ZERO3: shard.all_gather %arg3 {{.+}} {dlopt.backward, dlopt.layer = 1 : i64, dlopt.zero_gather = "bwd"} : tensor<2x2xf32> -> tensor<4x2xf32>
// ZERO3: %[[R0:.+]] = shard.all_gather %{{.+}} {dlopt.layer = 0 : i64, dlopt.recompute, dlopt.zero_gather = "fwd"} : tensor<1x10xf32> -> tensor<2x10xf32>
// ZERO3-NEXT: %[[RW:.+]] = dlopt.slice %[[R0]] start = [0, 0] limit = [2, 8]
// ZERO3-NEXT: %[[FW:.+]] = dlopt.reshape %[[RW]] {{.+}} : tensor<2x8xf32> -> tensor<4x4xf32>
// ZERO3: dlopt.matmul %{{.+}}, %[[FW]] {dlopt.layer = 0 : i64, dlopt.recompute}
// ZERO3: dlopt.matmul %{{.+}}, %[[FW]] {dlopt.backward, dlopt.layer = 0 : i64, transpose_b}
// ZERO3-NOT: zero_gather = "bwd"
// ZERO3: return

// bucket-mb=0: one collective per tensor.
// NONE-LABEL: func.func @main
// NONE-NOT: dlopt.concat
// NONE-COUNT-4: shard.reduce_scatter
// NONE-NOT: dlopt.concat
// NONE-COUNT-4: shard.all_gather
// NONE-NOT: dlopt.concat
func.func @main(%x: tensor<8x4xf32> {dlopt.input = "x"},
                %w: tensor<4x4xf32> {dlopt.param = "w"},
                %c: tensor<4xf32> {dlopt.param = "c"},
                %v: tensor<4x2xf32> {dlopt.param = "v"},
                %d: tensor<2xf32> {dlopt.param = "d"},
                %t: tensor<8x2xf32> {dlopt.input = "t"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %h = dlopt.matmul %x, %w {dlopt.layer = 0 : i64} : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  %hc = dlopt.add %h, %c {dlopt.layer = 0 : i64} : tensor<8x4xf32>, tensor<4xf32> -> tensor<8x4xf32>
  %r = dlopt.tanh %hc {dlopt.layer = 0 : i64} : tensor<8x4xf32>
  %o = dlopt.matmul %r, %v {dlopt.layer = 1 : i64} : tensor<8x4xf32>, tensor<4x2xf32> -> tensor<8x2xf32>
  %od = dlopt.add %o, %d {dlopt.layer = 1 : i64} : tensor<8x2xf32>, tensor<2xf32> -> tensor<8x2xf32>
  %l = dlopt.mse %od, %t : tensor<8x2xf32>, tensor<8x2xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Pipeline stages (the plan's dlopt.stage on forward ops): a bucket never
// mixes stages, which would pull one stage's gradients to the other and
// send the sums back. w lives on stage 0 and v on stage 1: one
// reduce-scatter and one gather each.
// ZERO2-LABEL: func.func @main
// ZERO2-NOT: dlopt.concat
// ZERO2: shard.reduce_scatter {{.+}} : tensor<4x2xf32> -> tensor<2x2xf32>
// ZERO2: shard.reduce_scatter {{.+}} : tensor<4x4xf32> -> tensor<2x4xf32>
// ZERO2: shard.reduce_scatter {{.+}} : tensor<4x2xf32> -> tensor<2x2xf32>
// ZERO2: shard.reduce_scatter {{.+}} : tensor<4x4xf32> -> tensor<2x4xf32>
// ZERO2-NOT: dlopt.concat
// ZERO2: return
func.func @main(%x: tensor<8x4xf32> {dlopt.input = "x"},
                %w: tensor<4x4xf32> {dlopt.param = "w"},
                %v: tensor<4x2xf32> {dlopt.param = "v"},
                %t: tensor<8x2xf32> {dlopt.input = "t"})
    -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
  %h = dlopt.matmul %x, %w {dlopt.stage = 0 : i64} : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  %y = dlopt.matmul %h, %v {dlopt.stage = 1 : i64} : tensor<8x4xf32>, tensor<4x2xf32> -> tensor<8x2xf32>
  %l = dlopt.mse %y, %t : tensor<8x2xf32>, tensor<8x2xf32> -> tensor<f32>
  return %l : tensor<f32>
}
