// RUN: dlopt-opt %s --split-input-file --verify-diagnostics

func.func @unary_int(%x: tensor<4xi32>) -> tensor<4xi32> {
  // expected-error @+1 {{operand #0 must be statically shaped f32/f16/bf16 tensor of 32-bit float or 16-bit float or bfloat16 type values, but got 'tensor<4xi32>'}}
  %0 = dlopt.exp %x : tensor<4xi32>
  return %0 : tensor<4xi32>
}

// -----

func.func @dynamic(%x: tensor<?xf32>) -> tensor<?xf32> {
  // expected-error @+1 {{must be statically shaped}}
  %0 = dlopt.exp %x : tensor<?xf32>
  return %0 : tensor<?xf32>
}

// -----

func.func @unary_result(%x: tensor<4xf32>) -> tensor<5xf32> {
  // expected-error @+1 {{'dlopt.neg' op all non-scalar operands/results must have the same shape and base type}}
  %0 = "dlopt.neg"(%x) : (tensor<4xf32>) -> tensor<5xf32>
  return %0 : tensor<5xf32>
}

// -----

func.func @gelu(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{expects approximate = "none" or "tanh", got "fast"}}
  %0 = dlopt.gelu %x {approximate = "fast"} : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @cast_shape(%x: tensor<4xf32>) -> tensor<5xi32> {
  // expected-error @+1 {{'dlopt.cast' op all non-scalar operands/results must have the same shape and base type}}
  %0 = dlopt.cast %x : tensor<4xf32> -> tensor<5xi32>
  return %0 : tensor<5xi32>
}

// -----

func.func @binary_elem(%a: tensor<4xf32>, %b: tensor<4xf16>) -> tensor<4xf32> {
  // expected-error @+2 {{'dlopt.add' op expects operands of the same element type, got 'f32' and 'f16'}}
  // expected-error @+1 {{'dlopt.add' op failed to infer returned types}}
  %0 = dlopt.add %a, %b : tensor<4xf32>, tensor<4xf16> -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @binary_shape(%a: tensor<4x3xf32>, %b: tensor<4xf32>) -> tensor<4x3xf32> {
  // expected-error @+2 {{'dlopt.mul' op expects broadcast-compatible shapes, got [4, 3] and [4] (operand #1)}}
  // expected-error @+1 {{'dlopt.mul' op failed to infer returned types}}
  %0 = dlopt.mul %a, %b : tensor<4x3xf32>, tensor<4xf32> -> tensor<4x3xf32>
  return %0 : tensor<4x3xf32>
}

// -----

func.func @binary_result(%a: tensor<4x3xf32>, %b: tensor<3xf32>) -> tensor<4x4xf32> {
  // expected-error @+2 {{'dlopt.sub' op inferred type(s) 'tensor<4x3xf32>' are incompatible with return type(s) of operation 'tensor<4x4xf32>'}}
  // expected-error @+1 {{'dlopt.sub' op failed to infer returned types}}
  %0 = dlopt.sub %a, %b : tensor<4x3xf32>, tensor<3xf32> -> tensor<4x4xf32>
  return %0 : tensor<4x4xf32>
}

// -----

func.func @pow_int(%a: tensor<4xi32>) -> tensor<4xi32> {
  // expected-error @+1 {{operand #0 must be statically shaped f32/f16/bf16 tensor}}
  %0 = dlopt.pow %a, %a : tensor<4xi32>, tensor<4xi32> -> tensor<4xi32>
  return %0 : tensor<4xi32>
}

// -----

func.func @compare_result(%a: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{result #0 must be statically shaped i1 tensor}}
  %0 = dlopt.compare eq, %a, %a : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @compare_pred(%a: tensor<4xf32>) -> tensor<4xi1> {
  // expected-error @+1 {{expected string or keyword containing one of the following enum values for attribute 'predicate' [eq, ne, lt, le, gt, ge]}}
  %0 = dlopt.compare 12, %a, %a : tensor<4xf32>, tensor<4xf32> -> tensor<4xi1>
  return %0 : tensor<4xi1>
}

// -----

func.func @select_cond(%c: tensor<3xi1>, %a: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+2 {{'dlopt.select' op expects the condition shape [3] to broadcast with the value shape [4]}}
  // expected-error @+1 {{'dlopt.select' op failed to infer returned types}}
  %0 = dlopt.select %c, %a, %a : tensor<3xi1>, tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @reduce_dim(%x: tensor<4x3xf32>) -> tensor<4xf32> {
  // expected-error @+2 {{'dlopt.sum' op expects dims in [-2, 2), got 2}}
  // expected-error @+1 {{'dlopt.sum' op failed to infer returned types}}
  %0 = dlopt.sum %x dims = [2] : tensor<4x3xf32> -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @reduce_dup(%x: tensor<4x3xf32>) -> tensor<4xf32> {
  // expected-error @+2 {{'dlopt.max' op expects distinct dims, got -1 twice}}
  // expected-error @+1 {{'dlopt.max' op failed to infer returned types}}
  %0 = dlopt.max %x dims = [1, -1] : tensor<4x3xf32> -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @reduce_result(%x: tensor<4x3xf32>) -> tensor<4xf32> {
  // expected-error @+2 {{'dlopt.mean' op inferred type(s) 'tensor<4x1xf32>' are incompatible with return type(s) of operation 'tensor<4xf32>'}}
  // expected-error @+1 {{'dlopt.mean' op failed to infer returned types}}
  %0 = dlopt.mean %x dims = [1] keepdims : tensor<4x3xf32> -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @matmul_rank(%a: tensor<4xf32>, %b: tensor<4x3xf32>) -> tensor<3xf32> {
  // expected-error @+2 {{'dlopt.matmul' op expects operands of rank >= 2, got rank 1 and rank 2}}
  // expected-error @+1 {{'dlopt.matmul' op failed to infer returned types}}
  %0 = dlopt.matmul %a, %b : tensor<4xf32>, tensor<4x3xf32> -> tensor<3xf32>
  return %0 : tensor<3xf32>
}

// -----

func.func @matmul_k(%a: tensor<2x4xf32>, %b: tensor<5x3xf32>) -> tensor<2x3xf32> {
  // expected-error @+2 {{'dlopt.matmul' op expects matching contraction sizes, got K = 4 (lhs) and K = 5 (rhs)}}
  // expected-error @+1 {{'dlopt.matmul' op failed to infer returned types}}
  %0 = dlopt.matmul %a, %b : tensor<2x4xf32>, tensor<5x3xf32> -> tensor<2x3xf32>
  return %0 : tensor<2x3xf32>
}

// -----

func.func @matmul_batch(%a: tensor<2x2x4xf32>, %b: tensor<3x4x3xf32>) -> tensor<2x2x3xf32> {
  // expected-error @+2 {{'dlopt.matmul' op expects broadcast-compatible batch dims, got [2] and [3]}}
  // expected-error @+1 {{'dlopt.matmul' op failed to infer returned types}}
  %0 = dlopt.matmul %a, %b : tensor<2x2x4xf32>, tensor<3x4x3xf32> -> tensor<2x2x3xf32>
  return %0 : tensor<2x2x3xf32>
}

// -----

func.func @reshape_count(%x: tensor<4x3xf32>) -> tensor<13xf32> {
  // expected-error @+1 {{'dlopt.reshape' op expects the same number of elements, got 12 in 'tensor<4x3xf32>' and 13 in 'tensor<13xf32>'}}
  %0 = dlopt.reshape %x : tensor<4x3xf32> -> tensor<13xf32>
  return %0 : tensor<13xf32>
}

// -----

func.func @transpose_perm(%x: tensor<4x3xf32>) -> tensor<3x4xf32> {
  // expected-error @+2 {{'dlopt.transpose' op expects perm to be a permutation of [0, 2), got [1, 1]}}
  // expected-error @+1 {{'dlopt.transpose' op failed to infer returned types}}
  %0 = dlopt.transpose %x perm = [1, 1] : tensor<4x3xf32> -> tensor<3x4xf32>
  return %0 : tensor<3x4xf32>
}

// -----

func.func @broadcast(%x: tensor<4x3xf32>) -> tensor<4x5xf32> {
  // expected-error @+1 {{'dlopt.broadcast_to' op cannot broadcast [4, 3] to [4, 5]}}
  %0 = dlopt.broadcast_to %x : tensor<4x3xf32> -> tensor<4x5xf32>
  return %0 : tensor<4x5xf32>
}

// -----

func.func @concat_size(%a: tensor<4x3xf32>, %b: tensor<4x2xf32>) -> tensor<8x3xf32> {
  // expected-error @+2 {{'dlopt.concat' op expects operand #1 to have size 3 in dim 1, got 2}}
  // expected-error @+1 {{'dlopt.concat' op failed to infer returned types}}
  %0 = dlopt.concat %a, %b dim = 0 : tensor<4x3xf32>, tensor<4x2xf32> -> tensor<8x3xf32>
  return %0 : tensor<8x3xf32>
}

// -----

func.func @slice_range(%x: tensor<4x3xf32>) -> tensor<4x3xf32> {
  // expected-error @+2 {{'dlopt.slice' op expects 0 <= start <= limit <= 3 in dim 1, got start = 0 and limit = 4}}
  // expected-error @+1 {{'dlopt.slice' op failed to infer returned types}}
  %0 = dlopt.slice %x start = [0, 0] limit = [4, 4] stride = [1, 1] : tensor<4x3xf32> -> tensor<4x3xf32>
  return %0 : tensor<4x3xf32>
}

// -----

func.func @slice_stride(%x: tensor<4x3xf32>) -> tensor<4x3xf32> {
  // expected-error @+2 {{'dlopt.slice' op expects stride >= 1 in dim 0, got 0}}
  // expected-error @+1 {{'dlopt.slice' op failed to infer returned types}}
  %0 = dlopt.slice %x start = [0, 0] limit = [4, 3] stride = [0, 1] : tensor<4x3xf32> -> tensor<4x3xf32>
  return %0 : tensor<4x3xf32>
}

// -----

func.func @gather_ids(%t: tensor<10x4xf32>, %i: tensor<3xf32>) -> tensor<3x4xf32> {
  // expected-error @+1 {{operand #1 must be statically shaped i32/i64 tensor}}
  %0 = dlopt.gather %t, %i : tensor<10x4xf32>, tensor<3xf32> -> tensor<3x4xf32>
  return %0 : tensor<3x4xf32>
}

// -----

func.func @iota() -> tensor<4xi32> {
  // expected-error @+1 {{'dlopt.iota' op expects dim in [-1, 1), got 1}}
  %0 = dlopt.iota dim = 1 : tensor<4xi32>
  return %0 : tensor<4xi32>
}

// -----

func.func @softmax_dim(%x: tensor<4x3xf32>) -> tensor<4x3xf32> {
  // expected-error @+1 {{'dlopt.softmax' op expects dim in [-2, 2), got 5}}
  %0 = dlopt.softmax %x dim = 5 : tensor<4x3xf32>
  return %0 : tensor<4x3xf32>
}

// -----

func.func @layer_norm_weight(%x: tensor<4x3xf32>, %w: tensor<4xf32>) -> tensor<4x3xf32> {
  // expected-error @+1 {{'dlopt.layer_norm' op expects weight of type 'tensor<3xf32>' (the input's dims from axis 1), got 'tensor<4xf32>'}}
  %0 = dlopt.layer_norm %x weight(%w) : (tensor<4x3xf32>, tensor<4xf32>) -> tensor<4x3xf32>
  return %0 : tensor<4x3xf32>
}

// -----

func.func @layer_norm_axis(%x: tensor<4x3xf32>) -> tensor<4x3xf32> {
  // expected-error @+1 {{'dlopt.layer_norm' op expects axis in [-2, 2), got 2}}
  %0 = dlopt.layer_norm %x {axis = 2} : (tensor<4x3xf32>) -> tensor<4x3xf32>
  return %0 : tensor<4x3xf32>
}

// -----

func.func @rms_norm_weight(%x: tensor<4x3xf32>, %w: tensor<3xbf16>) -> tensor<4x3xf32> {
  // expected-error @+1 {{'dlopt.rms_norm' op expects weight of type 'tensor<3xf32>' (the input's dims from axis 1), got 'tensor<3xbf16>'}}
  %0 = dlopt.rms_norm %x weight(%w) : (tensor<4x3xf32>, tensor<3xbf16>) -> tensor<4x3xf32>
  return %0 : tensor<4x3xf32>
}

// -----

func.func @attention_rank(%q: tensor<2x16x8xf32>) -> tensor<2x16x8xf32> {
  // expected-error @+2 {{'dlopt.attention' op expects query of rank 4 [batch, heads, seq, dim], got 'tensor<2x16x8xf32>'}}
  // expected-error @+1 {{'dlopt.attention' op failed to infer returned types}}
  %0 = dlopt.attention %q, %q, %q : tensor<2x16x8xf32>, tensor<2x16x8xf32>, tensor<2x16x8xf32> -> tensor<2x16x8xf32>
  return %0 : tensor<2x16x8xf32>
}

// -----

func.func @attention_heads(%q: tensor<1x4x8x8xf32>, %k: tensor<1x3x8x8xf32>) -> tensor<1x4x8x8xf32> {
  // expected-error @+2 {{'dlopt.attention' op expects query heads (4) to be a multiple of key/value heads (3)}}
  // expected-error @+1 {{'dlopt.attention' op failed to infer returned types}}
  %0 = dlopt.attention %q, %k, %k : tensor<1x4x8x8xf32>, tensor<1x3x8x8xf32>, tensor<1x3x8x8xf32> -> tensor<1x4x8x8xf32>
  return %0 : tensor<1x4x8x8xf32>
}

// -----

func.func @attention_causal(%q: tensor<1x4x8x8xf32>, %k: tensor<1x4x4x8xf32>) -> tensor<1x4x8x8xf32> {
  // expected-error @+2 {{'dlopt.attention' op expects causal attention with at least as many keys (4) as queries (8)}}
  // expected-error @+1 {{'dlopt.attention' op failed to infer returned types}}
  %0 = dlopt.attention %q, %k, %k {causal} : tensor<1x4x8x8xf32>, tensor<1x4x4x8xf32>, tensor<1x4x4x8xf32> -> tensor<1x4x8x8xf32>
  return %0 : tensor<1x4x8x8xf32>
}

// -----

func.func @rope_odd(%x: tensor<1x2x4x7xf32>) -> tensor<1x2x4x7xf32> {
  // expected-error @+1 {{'dlopt.rope' op expects rank >= 2 and an even last dim, got 'tensor<1x2x4x7xf32>'}}
  %0 = dlopt.rope %x : tensor<1x2x4x7xf32>
  return %0 : tensor<1x2x4x7xf32>
}

// -----

func.func @conv_channels(%x: tensor<1x3x8x8xf32>, %w: tensor<4x2x3x3xf32>) -> tensor<1x4x6x6xf32> {
  // expected-error @+2 {{'dlopt.conv2d' op expects filter dim 1 = channels / groups = 3, got 2}}
  // expected-error @+1 {{'dlopt.conv2d' op failed to infer returned types}}
  %0 = dlopt.conv2d %x, %w : (tensor<1x3x8x8xf32>, tensor<4x2x3x3xf32>) -> tensor<1x4x6x6xf32>
  return %0 : tensor<1x4x6x6xf32>
}

// -----

func.func @conv_groups(%x: tensor<1x4x8x8xf32>, %w: tensor<6x2x3x3xf32>) -> tensor<1x6x6x6xf32> {
  // expected-error @+2 {{'dlopt.conv2d' op expects groups (4) >= 1 dividing input channels (4) and output channels (6)}}
  // expected-error @+1 {{'dlopt.conv2d' op failed to infer returned types}}
  %0 = dlopt.conv2d %x, %w {groups = 4} : (tensor<1x4x8x8xf32>, tensor<6x2x3x3xf32>) -> tensor<1x6x6x6xf32>
  return %0 : tensor<1x6x6x6xf32>
}

// -----

func.func @pool_big(%x: tensor<1x4x2x2xf32>) -> tensor<1x4x1x1xf32> {
  // expected-error @+2 {{'dlopt.max_pool2d' op gives an empty output: the kernel is larger than the padded input}}
  // expected-error @+1 {{'dlopt.max_pool2d' op failed to infer returned types}}
  %0 = dlopt.max_pool2d %x {kernel = array<i64: 3, 3>} : tensor<1x4x2x2xf32> -> tensor<1x4x1x1xf32>
  return %0 : tensor<1x4x1x1xf32>
}

// -----

func.func @batch_norm_stats(%x: tensor<2x4x3x3xf32>, %s: tensor<4xf32>, %bad: tensor<3xf32>) -> tensor<2x4x3x3xf32> {
  // expected-error @+2 {{'dlopt.batch_norm' op expects running_var of type 'tensor<4xf32>', got 'tensor<3xf32>'}}
  // expected-error @+1 {{'dlopt.batch_norm' op failed to infer returned types}}
  %0:3 = dlopt.batch_norm %x, %s, %s, %s, %bad : (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<3xf32>) -> (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>)
  return %0#0 : tensor<2x4x3x3xf32>
}

// -----

func.func @dropout_rate(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'dlopt.dropout' op expects rate in [0, 1), got 1}}
  %0 = dlopt.dropout %x {rate = 1.0, seed = 1} : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @dropout_seed(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{requires attribute 'seed'}}
  %0 = dlopt.dropout %x {rate = 0.5} : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @dropout_offset_rank(%x: tensor<4xf32>, %s: tensor<1xi64>) -> tensor<4xf32> {
  // expected-error @+1 {{'dlopt.dropout' op expects offset to be a rank-0 integer tensor, got 'tensor<1xi64>'}}
  %0 = dlopt.dropout %x offset(%s : tensor<1xi64>) {rate = 0.5, seed = 1} : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @dropout_offset_float(%x: tensor<4xf32>, %s: tensor<f32>) -> tensor<4xf32> {
  // expected-error @+1 {{'dlopt.dropout' op operand #1 must be statically shaped i32/i64 tensor}}
  %0 = dlopt.dropout %x offset(%s : tensor<f32>) {rate = 0.5, seed = 1} : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @dropout_type(%x: tensor<4xf32>) -> tensor<4xf16> {
  // expected-error @+1 {{'dlopt.dropout' op failed to verify that all of {input, result} have same type}}
  %0 = "dlopt.dropout"(%x) {rate = 0.5 : f64, seed = 1 : i64} : (tensor<4xf32>) -> tensor<4xf16>
  return %0 : tensor<4xf16>
}

// -----

func.func @ce_labels(%l: tensor<8x10xf32>, %y: tensor<4xi32>) -> tensor<f32> {
  // expected-error @+2 {{'dlopt.cross_entropy' op expects labels of shape [8] (one per row), got 'tensor<4xi32>'}}
  // expected-error @+1 {{'dlopt.cross_entropy' op failed to infer returned types}}
  %0 = dlopt.cross_entropy %l, %y : tensor<8x10xf32>, tensor<4xi32> -> tensor<f32>
  return %0 : tensor<f32>
}

// -----

func.func @ce_result_type(%l: tensor<8x10xbf16>, %y: tensor<8xi32>) -> tensor<f16> {
  // The loss has the logits' element type or f32, nothing else.
  // expected-error @+2 {{'dlopt.cross_entropy' op inferred type(s) 'tensor<bf16>' are incompatible with return type(s) of operation 'tensor<f16>'}}
  // expected-error @+1 {{'dlopt.cross_entropy' op failed to infer returned types}}
  %0 = dlopt.cross_entropy %l, %y : tensor<8x10xbf16>, tensor<8xi32> -> tensor<f16>
  return %0 : tensor<f16>
}

// -----

func.func @ce_grad_dloss_type(%l: tensor<8x10xbf16>, %y: tensor<8xi32>, %d: tensor<f16>) -> tensor<8x10xbf16> {
  // expected-error @+1 {{'dlopt.cross_entropy_grad' op}}
  %0 = dlopt.cross_entropy_grad %l, %y, %d : (tensor<8x10xbf16>, tensor<8xi32>, tensor<f16>) -> tensor<8x10xbf16>
  return %0 : tensor<8x10xbf16>
}

// -----

func.func @mse_shape(%a: tensor<4xf32>, %b: tensor<5xf32>) -> tensor<f32> {
  // expected-error @+2 {{'dlopt.mse' op expects operands of the same type, got 'tensor<4xf32>' and 'tensor<5xf32>'}}
  // expected-error @+1 {{'dlopt.mse' op failed to infer returned types}}
  %0 = dlopt.mse %a, %b : tensor<4xf32>, tensor<5xf32> -> tensor<f32>
  return %0 : tensor<f32>
}

// -----

// expected-error @+1 {{argument #0: 'dlopt.init' has unknown dist 'gaussian', expected one of zeros, ones, constant, normal, truncated_normal, uniform}}
func.func @init_dist(%w: tensor<4xf32> {dlopt.param = "w", dlopt.init = {dist = "gaussian"}}) {
  return
}

// -----

// expected-error @+1 {{argument #0: 'dlopt.init' expects 'std' > 0, got -1}}
func.func @init_std(%w: tensor<4xf32> {dlopt.param = "w", dlopt.init = {dist = "normal", std = -1.0}}) {
  return
}

// -----

// expected-error @+1 {{argument #0: 'dlopt.init' has unexpected entry 'std' for dist 'uniform'}}
func.func @init_key(%w: tensor<4xf32> {dlopt.param = "w", dlopt.init = {dist = "uniform", std = 1.0}}) {
  return
}

// -----

// expected-error @+1 {{argument #0: 'dlopt.param' expects a non-empty string name, got 3 : i64}}
func.func @param_name(%w: tensor<4xf32> {dlopt.param = 3}) {
  return
}

// -----

// expected-error @+1 {{argument #0: unknown dlopt argument attribute 'dlopt.weight', expected dlopt.param, dlopt.input, dlopt.state, dlopt.init or dlopt.sharding}}
func.func @unknown_arg_attr(%w: tensor<4xf32> {dlopt.weight}) {
  return
}

// -----

// expected-error @+1 {{result #0: 'dlopt.output' expects a non-empty string, got unit}}
func.func @output_name(%w: tensor<4xf32>) -> (tensor<4xf32> {dlopt.output}) {
  return %w : tensor<4xf32>
}

// -----

func.func @layer_mark(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'dlopt.layer' expects a non-negative integer, got -2 : i64}}
  %0 = dlopt.exp %x {dlopt.layer = -2} : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @unknown_op(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{custom op 'dlopt.softplus' is unknown}}
  %0 = dlopt.softplus %x : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @fused_result_shapes(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<2xf32>) {
  // expected-error @+1 {{'dlopt.fused_elementwise' op expects every result to have the fused shape of result #0 ('tensor<4xf32>'), got 'tensor<2xf32>' for result #1}}
  %r:2 = dlopt.fused_elementwise(%x) : (tensor<4xf32>) -> (tensor<4xf32>, tensor<2xf32>) {
  ^bb0(%a: tensor<4xf32>):
    dlopt.yield %a, %a : tensor<4xf32>, tensor<4xf32>
  }
  return %r#0, %r#1 : tensor<4xf32>, tensor<2xf32>
}

// -----

func.func @fused_input_shape(%x: tensor<4xf32>, %b: tensor<2xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'dlopt.fused_elementwise' op expects input #1 to have the fused shape or rank 0, got 'tensor<2xf32>'}}
  %r = dlopt.fused_elementwise(%x, %b) : (tensor<4xf32>, tensor<2xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>, %c: tensor<2xf32>):
    dlopt.yield %a : tensor<4xf32>
  }
  return %r : tensor<4xf32>
}

// -----

func.func @fused_arg_types(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'dlopt.fused_elementwise' op expects body argument #0 to have the type of input #0 ('tensor<4xf32>'), got 'tensor<4xbf16>'}}
  %r = dlopt.fused_elementwise(%x) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xbf16>):
    %0 = dlopt.cast %a : tensor<4xbf16> -> tensor<4xf32>
    dlopt.yield %0 : tensor<4xf32>
  }
  return %r : tensor<4xf32>
}

// -----

func.func @fused_not_elementwise(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  // expected-note @+1 {{in this group}}
  %r = dlopt.fused_elementwise(%x) : (tensor<4x4xf32>) -> tensor<4x4xf32> {
  ^bb0(%a: tensor<4x4xf32>):
    // expected-error @+1 {{'dlopt.matmul' op cannot be fused: expects a float elementwise dlopt op}}
    %0 = dlopt.matmul %a, %a : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
    dlopt.yield %0 : tensor<4x4xf32>
  }
  return %r : tensor<4x4xf32>
}

// -----

func.func @fused_int_op(%x: tensor<4xi32>) -> tensor<4xf32> {
  // expected-error @+1 {{operand #0 must be variadic of statically shaped f32/f16/bf16 tensor}}
  %r = dlopt.fused_elementwise(%x) : (tensor<4xi32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xi32>):
    %0 = dlopt.cast %a : tensor<4xi32> -> tensor<4xf32>
    dlopt.yield %0 : tensor<4xf32>
  }
  return %r : tensor<4xf32>
}

// -----

func.func @fused_inner_shape(%x: tensor<4xf32>, %s: tensor<f32>) -> tensor<4xf32> {
  // expected-note @+1 {{in this group}}
  %r = dlopt.fused_elementwise(%x, %s) : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>, %b: tensor<f32>):
    // expected-error @+1 {{'dlopt.exp' op in a fused group expects a result of the fused shape 'tensor<4xf32>', got 'tensor<f32>'}}
    %0 = dlopt.exp %b : tensor<f32>
    %1 = dlopt.add %a, %0 : tensor<4xf32>, tensor<f32> -> tensor<4xf32>
    dlopt.yield %1 : tensor<4xf32>
  }
  return %r : tensor<4xf32>
}

// -----

func.func @fused_constant(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-note @+1 {{in this group}}
  %r = dlopt.fused_elementwise(%x) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    // expected-error @+1 {{'arith.constant' op in a fused group expects a rank-0 float tensor constant, got 'tensor<4xf32>'}}
    %c = arith.constant dense<1.0> : tensor<4xf32>
    %0 = dlopt.add %a, %c : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
    dlopt.yield %0 : tensor<4xf32>
  }
  return %r : tensor<4xf32>
}

// -----

// A compare's i1 result never leaves the group: results are float tensors.
func.func @fused_compare_result(%x: tensor<4xf32>) -> tensor<4xf32> {
  %r = dlopt.fused_elementwise(%x) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    %0 = dlopt.compare gt, %a, %a : tensor<4xf32>, tensor<4xf32> -> tensor<4xi1>
    // expected-error @+1 {{'dlopt.yield' op expects the types of the group's results ('tensor<4xf32>'), got ('tensor<4xi1>')}}
    dlopt.yield %0 : tensor<4xi1>
  }
  return %r : tensor<4xf32>
}

// -----

func.func @fused_yield_types(%x: tensor<4xf32>) -> tensor<4xf32> {
  %r = dlopt.fused_elementwise(%x) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    %0 = dlopt.cast %a : tensor<4xf32> -> tensor<4xbf16>
    // expected-error @+1 {{'dlopt.yield' op expects the types of the group's results ('tensor<4xf32>'), got ('tensor<4xbf16>')}}
    dlopt.yield %0 : tensor<4xbf16>
  }
  return %r : tensor<4xf32>
}

// -----

func.func @fused_no_results(%x: tensor<4xf32>) {
  // expected-error @+1 {{'dlopt.fused_elementwise' op expects at least one result}}
  dlopt.fused_elementwise(%x) : (tensor<4xf32>) -> () {
  ^bb0(%a: tensor<4xf32>):
    dlopt.yield
  }
  return
}

// -----

func.func @yield_outside(%x: tensor<4xf32>) {
  // expected-error @+1 {{'dlopt.yield' op expects parent op 'dlopt.fused_elementwise'}}
  dlopt.yield %x : tensor<4xf32>
}

// -----

func.func @fused_segments_uneven(%x: tensor<4xf32>, %y: tensor<4xf32>, %z: tensor<4xf32>) {
  // expected-error @+1 {{'dlopt.fused_elementwise' op expects the inputs (3) and results (2) to split evenly into 2 segments}}
  %r:2 = dlopt.fused_elementwise(%x, %y, %z) attributes {segments = 2 : i64} : (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  ^bb0(%a: tensor<4xf32>):
    %0 = dlopt.neg %a : tensor<4xf32>
    dlopt.yield %0 : tensor<4xf32>
  }
  return
}

// -----

func.func @fused_segment_shape(%x: tensor<4xf32>, %y: tensor<5xf32>) {
  // expected-error @+1 {{'dlopt.fused_elementwise' op expects input #1 to have the fused shape or rank 0, got 'tensor<5xf32>'}}
  %r:2 = dlopt.fused_elementwise(%x, %y) attributes {segments = 2 : i64} : (tensor<4xf32>, tensor<5xf32>) -> (tensor<4xf32>, tensor<6xf32>) {
  ^bb0(%a: tensor<4xf32>):
    %0 = dlopt.neg %a : tensor<4xf32>
    dlopt.yield %0 : tensor<4xf32>
  }
  return
}

// -----

func.func @fused_segment_types(%x: tensor<4xf32>, %y: tensor<5xbf16>) {
  // expected-error @+1 {{'dlopt.fused_elementwise' op expects result #1 to have the element type of result #0 ('f32'), got 'tensor<5xbf16>'}}
  %r:2 = dlopt.fused_elementwise(%x, %y) attributes {segments = 2 : i64} : (tensor<4xf32>, tensor<5xbf16>) -> (tensor<4xf32>, tensor<5xbf16>) {
  ^bb0(%a: tensor<4xf32>):
    %0 = dlopt.neg %a : tensor<4xf32>
    dlopt.yield %0 : tensor<4xf32>
  }
  return
}

// -----

func.func @fused_segment_scalar(%x: tensor<4xf32>, %s: tensor<f32>, %y: tensor<5xf32>) {
  // expected-error @+1 {{'dlopt.fused_elementwise' op expects input #3 to have the element type and rank-0-ness of input #1 ('tensor<f32>'), got 'tensor<5xf32>'}}
  %r:2 = dlopt.fused_elementwise(%x, %s, %y, %y) attributes {segments = 2 : i64} : (tensor<4xf32>, tensor<f32>, tensor<5xf32>, tensor<5xf32>) -> (tensor<4xf32>, tensor<5xf32>) {
  ^bb0(%a: tensor<4xf32>, %b: tensor<f32>):
    %0 = dlopt.mul %a, %b : tensor<4xf32>, tensor<f32> -> tensor<4xf32>
    dlopt.yield %0 : tensor<4xf32>
  }
  return
}

// -----

func.func @fused_segments_zero(%x: tensor<4xf32>) {
  // expected-error @+1 {{'dlopt.fused_elementwise' op attribute 'segments' failed to satisfy constraint}}
  %r = dlopt.fused_elementwise(%x) attributes {segments = 0 : i64} : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    %0 = dlopt.neg %a : tensor<4xf32>
    dlopt.yield %0 : tensor<4xf32>
  }
  return
}

// -----

func.func @attention_offset_not_scalar(%q: tensor<1x2x4x8xf32>, %k: tensor<1x2x8x8xf32>, %o: tensor<2xi64>) -> tensor<1x2x4x8xf32> {
  // expected-error @+2 {{'dlopt.attention' op expects a rank-0 offset, got 'tensor<2xi64>'}}
  // expected-error @+1 {{'dlopt.attention' op failed to infer returned types}}
  %r = dlopt.attention %q, %k, %k offset(%o : tensor<2xi64>) {causal} : tensor<1x2x4x8xf32>, tensor<1x2x8x8xf32>, tensor<1x2x8x8xf32> -> tensor<1x2x4x8xf32>
  return %r : tensor<1x2x4x8xf32>
}

// -----

func.func @rope_offset_not_scalar(%x: tensor<2x4x8xf32>, %o: tensor<1xi32>) -> tensor<2x4x8xf32> {
  // expected-error @+1 {{'dlopt.rope' op expects a rank-0 offset, got 'tensor<1xi32>'}}
  %r = dlopt.rope %x offset(%o : tensor<1xi32>) : tensor<2x4x8xf32>
  return %r : tensor<2x4x8xf32>
}
