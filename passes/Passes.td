//===- Passes.td - dlopt passes ----------------------------*- tablegen -*-===//
#ifndef DLOPT_PASSES_TD
#define DLOPT_PASSES_TD

include "mlir/Pass/PassBase.td"

def CheckModelPass : Pass<"dlopt-check-model", "mlir::ModuleOp"> {
  let summary = "Checks the model conventions that compilation relies on";
  let description = [{
    Finds the entry function (`@main`, or the only public function) and
    checks that every argument is exactly one of `dlopt.param` or
    `dlopt.input`, that argument and output names are unique, that every
    result is a statically shaped tensor, that a `dlopt.loss` function
    returns a rank-0 float loss first, and that its body uses only ops the
    runtime can execute (dlopt ops, `arith.constant`, `func.return`).

    Then it stamps a stable id on every op of the entry body that has none
    (`dlopt.id = N : i64`, in program order from one past the largest id
    present; ops derived from a forward op, which carry `dlopt.fwd_id`, are
    left alone). The planner keys its plan by these ids, and the training
    transforms keep them: backward ops, recomputed clones and casts record
    the forward op they come from as `dlopt.fwd_id = N`. Ids already present
    must be unique (per `dlopt.mb` micro-batch).

    ```mlir
    // error: argument #1 (tensor<4x4xf32>) is neither a dlopt.param nor a dlopt.input
    func.func @main(%x: tensor<4x4xf32> {dlopt.input = "x"}, %w: tensor<4x4xf32>) ...
    // after the pass, a valid model's ops carry ids:
    %y = dlopt.matmul %x, %w {dlopt.id = 0 : i64} : ...
    ```
  }];
  let options = [
    Option<"entry", "entry", "std::string", /*default=*/"\"\"",
           "Name of the entry function (default: @main or the only public function)">
  ];
  let statistics = [
    Statistic<"numParams", "params", "Number of parameters">,
    Statistic<"numInputs", "inputs", "Number of inputs">,
    Statistic<"numStamped", "stamped-ids", "Number of ops given a stable id">
  ];
}

def AutodiffPass : Pass<"dlopt-autodiff", "mlir::ModuleOp"> {
  let summary = "Reverse-mode differentiation of the loss with respect to every dlopt.param";
  let description = [{
    Turns the entry function, which must be marked `dlopt.loss` and return a
    rank-0 float loss first, into a training-step function that returns the
    loss, the function's other results, and then the gradient of every
    `dlopt.param` in argument order. Gradient results are named
    `grad.<param>` and marked `dlopt.grad = "<param>"`. Each op's rule comes
    from its `AutodiffOpInterface`; backward ops are plain dlopt ops placed
    after the forward ops and carry the `dlopt.layer` mark of the op they
    differentiate. A parameter that does not reach the loss gets a warning
    and a zero gradient; a non-differentiable op on the path to the loss is
    an error naming the op.

    ```mlir
    // before
    func.func @main(%x: tensor<4xf32> {dlopt.input = "x"}, %w: tensor<4xf32> {dlopt.param = "w"})
        -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
      %0 = dlopt.mse %x, %w : tensor<4xf32>, tensor<4xf32> -> tensor<f32>
      return %0 : tensor<f32>
    }
    // after: -> (tensor<f32> {dlopt.output = "loss"},
    //            tensor<4xf32> {dlopt.grad = "w", dlopt.output = "grad.w"})
    ```
  }];
  let options = [
    Option<"entry", "entry", "std::string", /*default=*/"\"\"",
           "Name of the entry function (default: @main or the only public function)">
  ];
  let statistics = [
    Statistic<"numGradOps", "grad-ops", "Number of ops created for the backward pass">,
    Statistic<"numZeroGrads", "zero-grads", "Parameters that do not reach the loss">
  ];
  let dependentDialects = ["::dlopt::dl::DLOptDialect", "::mlir::arith::ArithDialect"];
}

def PartitionPass : Pass<"dlopt-partition", "mlir::ModuleOp"> {
  let summary = "Applies a plan's shardings: splits a differentiated step over a device mesh";
  let description = [{
    Runs after `dlopt-autodiff` and before `dlopt-optimizer`. The mesh
    (`axes`, `sizes`; axes of size 1 are dropped) becomes a `shard.grid
    @dlopt_mesh` and the module's `dlopt.mesh`. Arguments carry the plan's
    shardings as `dlopt.sharding` (per dim, the mesh axes it is split over,
    major first, e.g. `[[], ["tp"]]` for a column-parallel weight); an input
    without one is split on dim 0 over `dp`.

    The step is partitioned one axis at a time. Every op is rewritten to its
    local types by a per-op rule, and `shard.all_reduce`, `all_gather`,
    `reduce_scatter` and `all_slice` are inserted where a rule needs another
    form of a value: a column-parallel matmul followed by a row-parallel one
    gives one all-reduce of a partial sum (Megatron), an embedding whose
    table is split on its rows is looked up vocabulary-parallel, and
    cross-entropy over logits split on the classes reduces the row max, the
    sum of exponentials and the target logit over the axis. Means divide by
    global counts (mean and mse by the ranks, cross-entropy by the global
    number of valid rows). Gradients leave with their parameter's sharding;
    split arguments and results record `dlopt.global_type` and `dlopt.split`.
    An op without a rule for its operands' shardings is an error naming the
    op, the axis and the shardings.

    ```mlir
    // dp = 2: x: tensor<8x16xf32> becomes tensor<4x16xf32>, and
    %g = dlopt.matmul %x, %dy {transpose_a} : ... -> tensor<16x32xf32>
    %g2 = shard.all_reduce %g on @dlopt_mesh grid_axes = [0] : ...
    ```
  }];
  let options = [
    Option<"entry", "entry", "std::string", /*default=*/"\"\"",
           "Name of the entry function">,
    ListOption<"axes", "axes", "std::string",
               "Mesh axis names, major first (dp, cp, tp, ...)">,
    ListOption<"sizes", "sizes", "int64_t",
               "Ranks along each mesh axis">
  ];
  let dependentDialects = ["mlir::shard::ShardDialect"];
}

def PipelinePass : Pass<"dlopt-pipeline", "mlir::ModuleOp"> {
  let summary = "Cuts a training step into one function per pipeline stage, with send/recv between them, ordered by a micro-batch schedule";
  let description = [{
    Runs on a training step (after `dlopt-optimizer`, `dlopt-recompute` and
    before fusion) whose forward ops carry the plan's `dlopt.stage`. Every
    op is placed on a stage: a forward op on its plan stage, its backward
    and recomputed ops with it, other ops with the operand that arrives
    last in the pipeline (per micro-batch) or the largest operand (the
    optimizer), and ops that read only constants and arguments (learning
    rate, masks, slices of the inputs) on every stage that uses them.
    Parameters and optimizer state live on the stages that use them (a tied
    embedding on the first and the last). Each stage becomes a function
    `@<entry>.stage<s>` holding only its arguments and results. Values that
    cross stages travel in `dlopt.send_recv` ops over the mesh axis `pp`
    (added to the mesh, major): the sends of one micro-batch task and the
    receives of the next are posted together. Each stage's micro-batch
    tasks (forward, backward, and under `zero-bubble` the deferred weight
    gradient, per model chunk) run in the order of `schedule`, the order
    the planner's simulator replays; what follows the micro-batches
    (accumulation, clipping, the update) runs after them, with its
    transfers in one order on every stage.

    ```mlir
    // stage 0 of 2, 1F1B, 2 micro-batches:
    %a0 = ... forward of micro-batch 0 ...
    %a1 = ... forward of micro-batch 1 ...
    %g0 = dlopt.send_recv %a1 to [1] from [1] over "pp" : ...
    ```
  }];
  let options = [
    Option<"entry", "entry", "std::string", /*default=*/"\"\"", "Entry function name">,
    Option<"stages", "stages", "int64_t", /*default=*/"2", "Pipeline stages (pp)">,
    Option<"virtualStages", "virtual-stages", "int64_t", /*default=*/"1",
           "Model chunks per stage (interleaved 1F1B)">,
    Option<"schedule", "schedule", "std::string", /*default=*/"\"1f1b\"",
           "gpipe, 1f1b, interleaved or zero-bubble">,
    Option<"microBatches", "micro-batches", "int64_t", /*default=*/"1",
           "Micro-batches per step (the step's dlopt.mb marks)">
  ];
}

def OptimizerPass : Pass<"dlopt-optimizer", "mlir::ModuleOp"> {
  let summary = "Turns a differentiated model into a training step with an optimizer update";
  let description = [{
    Runs after `dlopt-autodiff`. Consumes the `dlopt.grad` results and
    emits, in ordinary dlopt ops: optional gradient accumulation over
    micro-batches, the learning-rate schedule, global-norm gradient
    clipping, and the SGD (momentum, nesterov, weight decay), Adam or AdamW
    update. Optimizer state is explicit: new arguments marked
    `dlopt.state = "<opt>.<moment>.<param>"` (zero-initialized) and a
    `tensor<i64>` step counter `dlopt.state = "step"`. The step function
    returns `loss`, `lr`, `grad_norm`, the model's other outputs, then the
    new value of every parameter and state, marked `dlopt.update = "<name>"`.
    With `accumulate=k`, every input gains a leading dimension of size k and
    the forward and backward pass run once per micro-batch, one after the
    other, summing gradients (only one micro-batch's activations are live at
    a time); loss and gradients are averaged over micro-batches.
    Every `dlopt.dropout` without an `offset` operand (forward and backward
    copies alike, so their masks keep matching) gets the `step` argument as
    its offset, so each step draws a new mask and `--resume` (which restores
    `step`) replays the same masks.

    With `zero=1|2|3` on a partitioned step (a `dlopt.mesh` with a `dp` or
    `cp` axis), every parameter with a dim whose local size divides by the
    number of replicas R is sharded on its first such dim over those axes
    (ZeRO, Rajbhandari et al. 2020): its optimizer state holds 1/R of it,
    its gradient's all-reduce becomes a reduce-scatter (the rest of the
    sum, over tp, stays an all-reduce of the shard), the update runs on the
    shard and the new parameter is all-gathered (stages 1 and 2). Stage 2
    reduce-scatters every micro-batch's gradient and accumulates shards;
    stage 1 accumulates whole gradients and reduce-scatters once. Stage 3
    stores the parameter sharded and all-gathers it right before its first
    use in the forward pass and again before its first use in the backward
    pass (each micro-batch), so the whole parameter lives only while used.
    Shards record their global layout (`dlopt.global_type`, `dlopt.split`
    with the replica axes appended on the sharded dim).

    In a partitioned step, gradients that are still all-reduced (every
    gradient without ZeRO) are reduced in buckets of at most `bucket-mb`
    MiB: consecutive gradients in backward order with the same axes and
    element type are flattened, concatenated, all-reduced once where the
    last of them is complete, and sliced back (element for element the same
    sums, far fewer collectives).

    ```mlir
    // before: (loss, grad.w) = f(x, w)
    // after:  (loss, lr, grad_norm, w', adamw.m.w', adamw.v.w', step') =
    //             f(x, w, adamw.m.w, adamw.v.w, step)
    ```
  }];
  let options = [
    Option<"entry", "entry", "std::string", /*default=*/"\"\"", "Entry function name">,
    Option<"optimizer", "optimizer", "std::string", /*default=*/"\"adamw\"",
           "sgd, adam or adamw">,
    Option<"lr", "lr", "double", /*default=*/"1e-3", "Peak learning rate">,
    Option<"momentum", "momentum", "double", /*default=*/"0.0", "SGD momentum">,
    Option<"nesterov", "nesterov", "bool", /*default=*/"false", "SGD Nesterov momentum">,
    Option<"weightDecay", "weight-decay", "double", /*default=*/"-1.0",
           "Weight decay (default: 0.01 for adamw, 0 otherwise)">,
    Option<"beta1", "beta1", "double", /*default=*/"0.9", "Adam beta1">,
    Option<"beta2", "beta2", "double", /*default=*/"0.999", "Adam beta2">,
    Option<"eps", "eps", "double", /*default=*/"1e-8", "Adam epsilon">,
    Option<"schedule", "schedule", "std::string", /*default=*/"\"constant\"",
           "constant, cosine or linear (decay after warmup)">,
    Option<"warmupSteps", "warmup-steps", "int64_t", /*default=*/"0",
           "Linear warmup steps">,
    Option<"totalSteps", "total-steps", "int64_t", /*default=*/"0",
           "Steps over which cosine/linear decay reaches min-lr">,
    Option<"minLr", "min-lr", "double", /*default=*/"0.0", "Final learning rate of the decay">,
    Option<"clipNorm", "clip-norm", "double", /*default=*/"0.0",
           "Clip gradients to this global L2 norm (0: off)">,
    Option<"gradNorm", "grad-norm", "bool", /*default=*/"true",
           "Compute the global gradient norm (result grad_norm); false "
           "skips its pass over every gradient (refused with clip-norm)">,
    Option<"accumulate", "accumulate", "int64_t", /*default=*/"1",
           "Micro-batches per step (gradient accumulation)">,
    Option<"growthInterval", "loss-scale-growth-interval", "int64_t", /*default=*/"2000",
           "Good steps before a dynamic loss scale (state 'loss_scale') doubles">,
    Option<"markMicroBatches", "mark-micro-batches", "bool", /*default=*/"false",
           "With accumulate = 1: mark the forward and backward ops dlopt.mb = 0 "
           "as the replay marks its copies (dlopt-pipeline schedules by them)">,
    Option<"zero", "zero", "int64_t", /*default=*/"0",
           "ZeRO stage (0-3) over the data-parallel replicas (mesh axes dp "
           "and cp) of a partitioned step: 1 shards the optimizer state, 2 "
           "also the gradients, 3 also the parameters">,
    Option<"bucketMb", "bucket-mb", "double", /*default=*/"25.0",
           "Gradient all-reduces of a partitioned step are fused into "
           "buckets of at most this many MiB, in backward order (0: one "
           "all-reduce per gradient)">
  ];
  let statistics = [
    Statistic<"numParams", "params", "Parameters updated">
  ];
  let dependentDialects = ["::dlopt::dl::DLOptDialect", "::mlir::arith::ArithDialect"];
}

def RecomputePass : Pass<"dlopt-recompute", "mlir::ModuleOp"> {
  let summary = "Activation recomputation: re-run forward ops right before their layer's backward pass";
  let description = [{
    Runs on a differentiated step (after `dlopt-autodiff`, after the last
    CSE, which would merge the copies back). For every layer (ops marked
    `dlopt.layer = N`), forward values of the layer that the backward pass
    reads are recomputed by clones (marked `dlopt.recompute`) placed just
    before the layer's first backward op, and the backward ops from there on
    read the clones. The originals then die during the forward pass, which
    lowers the planned peak memory.

    Policies: `none`; `full` keeps only each layer's inputs (values defined
    outside the layer) and recomputes everything else the backward pass
    needs; `selective` recomputes only softmax, log_softmax and dropout
    results (the attention score/softmax/dropout part: with the fused
    `dlopt.attention` the scores themselves are never stored) and, in a
    partitioned step, the all-gathers of activations over the `tp` or the
    `cp` mesh axis alone (sequence parallelism's norm outputs, context
    parallelism's keys and values; not ZeRO-3's parameter gathers): the
    backward pass gathers the kept shards again. `elementwise` recomputes
    every op of the layer but its matmuls, attention and convolutions
    (whose results are kept) and but collectives other than those gathers:
    norms, activation functions, rope, adds, reshapes, dropout.
    `alternate` recomputes that and, of each layer's matmuls in program
    order, the second, the fourth and so on (torchtitan's per-op selective
    activation checkpointing, which saves every other matmul's output);
    a matmul whose output is reduced across ranks keeps its result. Both
    re-run the ZeRO-3 parameter gathers that recomputed ops read, and the
    backward pass reads those gathers instead of its own.
  }];
  let options = [
    Option<"entry", "entry", "std::string", /*default=*/"\"\"", "Entry function name">,
    Option<"policy", "policy", "std::string", /*default=*/"\"full\"",
           "none, selective, elementwise, alternate or full">
  ];
  let statistics = [
    Statistic<"numCloned", "cloned-ops", "Forward ops cloned for recomputation">
  ];
}

def MixedPrecisionPass : Pass<"dlopt-mixed-precision", "mlir::ModuleOp"> {
  let summary = "Runs the forward pass in bf16 or fp16 with fp32 master weights";
  let description = [{
    Runs before `dlopt-autodiff`. Parameters stay fp32 (the master weights
    the optimizer updates, with fp32 optimizer state); each op computes in
    the low precision, with casts inserted where a value changes precision,
    except the ops kept in fp32 for accuracy: softmax, log_softmax, sum,
    mean, cross_entropy, mse and every op with only rank-0 results (loss
    arithmetic). (Norm, attention and matmul kernels
    accumulate their statistics and dot products in fp32 internally.) The
    function's results are cast back to their declared types. Because a
    cast's gradient is a cast back, gradients reach the fp32 parameters in
    fp32.

    With `precision=fp16` it also adds dynamic loss scaling state
    (`dlopt.state = "loss_scale"`, initially `init-scale`, and
    `"loss_scale.good_steps"`): `dlopt-autodiff` seeds the backward pass
    with the scale, and `dlopt-optimizer` unscales the gradients, skips the
    update (parameters and state unchanged) when any gradient is inf or NaN
    and halves the scale, and doubles it after the optimizer's
    `loss-scale-growth-interval` good steps.
  }];
  let options = [
    Option<"entry", "entry", "std::string", /*default=*/"\"\"", "Entry function name">,
    Option<"precision", "precision", "std::string", /*default=*/"\"bf16\"",
           "bf16 or fp16">,
    Option<"initScale", "init-scale", "double", /*default=*/"65536.0",
           "Initial fp16 loss scale">
  ];
  let statistics = [
    Statistic<"numCasts", "casts", "Casts inserted">
  ];
  let dependentDialects = ["::dlopt::dl::DLOptDialect"];
}

def IdentityCSEPass : InterfacePass<"dlopt-cse", "mlir::FunctionOpInterface"> {
  let summary = "Common subexpression elimination that ignores op identity";
  let description = [{
    Upstream `cse` compares every attribute, so two copies of an op that
    differ only in their stable ids (`dlopt.id`, `dlopt.fwd_id`, `dlopt.mb`,
    which every op has its own of) would never merge. This pass merges
    side-effect-free, region-free ops of the function body that are equal
    up to those identity attributes: the later op's uses go to the earlier
    one, which keeps its own identity. The compile pipeline runs it before
    upstream `cse`.

    Before:
    ```mlir
    %0 = dlopt.exp %x {dlopt.id = 0 : i64} : tensor<4xf32>
    %1 = dlopt.exp %x {dlopt.id = 1 : i64} : tensor<4xf32>
    %2 = dlopt.add %0, %1 {dlopt.id = 2 : i64} : ...
    ```
    After:
    ```mlir
    %0 = dlopt.exp %x {dlopt.id = 0 : i64} : tensor<4xf32>
    %2 = dlopt.add %0, %0 {dlopt.id = 2 : i64} : ...
    ```
  }];
  let statistics = [
    Statistic<"numMerged", "merged", "Number of ops merged into an equal earlier op">
  ];
}

def FoldBatchReductionsPass : InterfacePass<"dlopt-fold-batch-reductions",
                                            "mlir::FunctionOpInterface"> {
  let summary = "Weight gradients as one GEMM over the flattened batch; unit reductions as reshapes";
  let description = [{
    Autodiff writes the gradient of a weight that a matmul broadcasts over
    batch dims as a batched product summed over the batch. This pass
    rewrites `sum(matmul(a, b {transpose_a}), dims = every batch dim)`, when
    both operands carry the batch dims and the product has no other use, as
    one matmul of the operands flattened to `[batch * rows, cols]`: no
    `[batch, K, N]` temporary, one GEMM instead of `batch`, and f32
    accumulation over all rows before the one rounding. A `sum`, `mean` or
    `max` whose reduced dims all have size 1 becomes a `reshape`. New ops
    keep the marks of the op they replace. The compile pipeline runs it
    after autodiff, partitioning and the optimizer, on per-device shapes.

    Before:
    ```mlir
    %g = dlopt.matmul %x, %dy {transpose_a} : tensor<4x16x64xf32>, tensor<4x16x256xf32> -> tensor<4x64x256xf32>
    %w = dlopt.sum %g dims = [0] : tensor<4x64x256xf32> -> tensor<64x256xf32>
    ```
    After:
    ```mlir
    %0 = dlopt.reshape %x : tensor<4x16x64xf32> -> tensor<64x64xf32>
    %1 = dlopt.reshape %dy : tensor<4x16x256xf32> -> tensor<64x256xf32>
    %w = dlopt.matmul %0, %1 {transpose_a} : tensor<64x64xf32>, tensor<64x256xf32> -> tensor<64x256xf32>
    ```
  }];
  let statistics = [
    Statistic<"numGemms", "gemms", "Batch-summed matmuls made one GEMM">,
    Statistic<"numUnitReductions", "unit-reductions", "Reductions over size-1 dims made reshapes">
  ];
}

def FoldLossCastsPass : InterfacePass<"dlopt-fold-loss-casts",
                                      "mlir::FunctionOpInterface"> {
  let summary = "Cross-entropy reads bf16/f16 logits itself: no f32 copies of the logits and their gradient";
  let description = [{
    Mixed precision computes the loss in f32, so a bf16 model's logits are
    cast to f32 before `cross_entropy` and `cross_entropy_grad`, and the
    f32 gradient is cast back: for a 50257-word vocabulary two f32 copies
    of [tokens, 50257] that the loss kernels then read. Both ops read
    bf16/f16 logits as f32 themselves, give an f32 loss and take an f32
    `dloss`, so this pass rewrites

    - `cross_entropy(cast(x to f32))` with an f32 result as
      `cross_entropy(x) -> f32`, and
    - `cast(cross_entropy_grad(cast(x to f32), labels, dloss) to type(x))`,
      when the gradient has no other use, as
      `cross_entropy_grad(x, labels, dloss) -> type(x)`.

    The results are bit for bit the same (the widening cast is exact; the
    kernels compute in f32/f64 and round once, as the cast did). The
    compile pipeline runs it after `dlopt-fold-batch-reductions`.

    Before:
    ```mlir
    %f = dlopt.cast %x : tensor<8x10xbf16> -> tensor<8x10xf32>
    %l = dlopt.cross_entropy %f, %y : tensor<8x10xf32>, tensor<8xi32> -> tensor<f32>
    %g = dlopt.cross_entropy_grad %f, %y, %d : (tensor<8x10xf32>, tensor<8xi32>, tensor<f32>) -> tensor<8x10xf32>
    %h = dlopt.cast %g : tensor<8x10xf32> -> tensor<8x10xbf16>
    ```
    After:
    ```mlir
    %l = dlopt.cross_entropy %x, %y : tensor<8x10xbf16>, tensor<8xi32> -> tensor<f32>
    %h = dlopt.cross_entropy_grad %x, %y, %d : (tensor<8x10xbf16>, tensor<8xi32>, tensor<f32>) -> tensor<8x10xbf16>
    ```
  }];
  let statistics = [
    Statistic<"numLosses", "losses", "cross_entropy ops that read the narrow logits">,
    Statistic<"numGrads", "grads", "cross_entropy_grad ops that read and write the narrow type">
  ];
}

def FuseElementwisePass : InterfacePass<"dlopt-fuse-elementwise",
                                        "mlir::FunctionOpInterface"> {
  let summary = "Outlines chains of elementwise ops into dlopt.fused_elementwise";
  let description = [{
    Runs last in the compile pipeline. Groups float elementwise ops (`neg abs
    relu exp log sqrt rsqrt tanh sin cos sigmoid silu gelu cast add sub mul
    div maximum minimum pow`) whose results have the same shape and that are
    connected producer to consumer, and replaces each group of two or more
    ops with one `dlopt.fused_elementwise` that the exporter turns into one
    `fused_elementwise` instruction (one kernel). Operands of the fused shape
    and rank-0 operands (broadcast scalars) become inputs; rank-0 float
    constants are copied into the body; every value an op outside the group
    (or the function's return) uses stays a result. Ops join a group only
    with the same `dlopt.*` marks (layer, backward, recompute), which the
    group keeps, and a group never grows past the limits of the plan format
    (docs/executable-format.md).

    Before:
    ```mlir
    %0 = dlopt.mul %m, %c9 : tensor<4xf32>, tensor<f32> -> tensor<4xf32>
    %1 = dlopt.add %0, %g : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
    %2 = dlopt.sqrt %1 : tensor<4xf32>
    return %1, %2
    ```
    After:
    ```mlir
    %r:2 = dlopt.fused_elementwise(%m, %g) : (tensor<4xf32>, tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
    ^bb0(%a: tensor<4xf32>, %b: tensor<4xf32>):
      %c9 = arith.constant dense<9.000000e-01> : tensor<f32>
      %0 = dlopt.mul %a, %c9 : tensor<4xf32>, tensor<f32> -> tensor<4xf32>
      %1 = dlopt.add %0, %b : tensor<4xf32>, tensor<4xf32> -> tensor<4xf32>
      %2 = dlopt.sqrt %1 : tensor<4xf32>
      dlopt.yield %1, %2 : tensor<4xf32>, tensor<4xf32>
    }
    return %r#0, %r#1
    ```
  }];
  let options = [
    Option<"minGroupSize", "min-group-size", "int64_t", /*default=*/"2",
           "Smallest number of ops worth a fused group">
  ];
  let statistics = [
    Statistic<"numGroups", "groups", "Fused groups created">,
    Statistic<"numFusedOps", "fused-ops", "Elementwise ops moved into groups">
  ];
  let dependentDialects = ["::dlopt::dl::DLOptDialect",
                           "::mlir::arith::ArithDialect"];
}

def MergeFusedElementwisePass : InterfacePass<"dlopt-merge-fused-elementwise",
                                              "mlir::FunctionOpInterface"> {
  let summary = "Merges independent fused groups with one program into a "
                "multi-tensor group";
  let description = [{
    Runs after `dlopt-fuse-elementwise`. Groups (`dlopt.fused_elementwise`)
    whose bodies are the same per-element program (same ops, constants and
    attributes, same argument element types and rank-0-ness, same result
    element types, same `dlopt.*` marks) and that do not depend on each other
    become one multi-tensor group (`segments = N`) placed at the last of
    them: its inputs and results are the members' inputs and results in
    order, segment by segment, and it keeps the first member's body. The
    exporter writes one `fused_elementwise` instruction with a `segments`
    attribute; backends run all segments in one kernel (one CUDA launch).
    A group is not merged into a set when a result of the set is used by an
    op at or before it (a dependence). The typical use: the optimizer update
    of every parameter of a training step (multi-tensor apply).

    Before:
    ```mlir
    %0 = dlopt.fused_elementwise(%a, %lr) : (tensor<8xf32>, tensor<f32>) -> tensor<8xf32> {...}
    %1 = dlopt.fused_elementwise(%b, %lr) : (tensor<3x5xf32>, tensor<f32>) -> tensor<3x5xf32> {...}
    ```
    After:
    ```mlir
    %r:2 = dlopt.fused_elementwise(%a, %lr, %b, %lr) attributes {segments = 2 : i64} : (tensor<8xf32>, tensor<f32>, tensor<3x5xf32>, tensor<f32>) -> (tensor<8xf32>, tensor<3x5xf32>) {...}
    ```
  }];
  let statistics = [
    Statistic<"numMerged", "merged-groups", "Multi-tensor groups created">,
    Statistic<"numSegments", "segments", "Groups moved into multi-tensor groups">
  ];
  let dependentDialects = ["::dlopt::dl::DLOptDialect",
                           "::mlir::arith::ArithDialect"];
}

#endif // DLOPT_PASSES_TD
