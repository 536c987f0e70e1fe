//===- DLOptDialect.td - The dlopt dialect -----------------*- tablegen -*-===//
#ifndef DLOPT_DIALECT_TD
#define DLOPT_DIALECT_TD

include "mlir/IR/OpBase.td"

def DLOpt_Dialect : Dialect {
  let name = "dlopt";
  let summary = "Model-level tensor ops for deep-learning training";
  let description = [{
    The `dlopt` dialect describes deep-learning models as pure functions on
    statically shaped builtin tensors (`f32`, `f16`, `bf16`, `i32`, `i64`,
    `i1`). A model is a `func.func` whose arguments are marked as inputs or
    parameters and that returns a scalar loss or its outputs:

    ```mlir
    func.func @main(%x: tensor<8x4xf32> {dlopt.input = "x"},
                    %w: tensor<4x2xf32> {dlopt.param = "w",
                        dlopt.init = {dist = "normal", std = 0.02 : f64}},
                    %y: tensor<8xi32> {dlopt.input = "labels"})
        -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
      %h = dlopt.matmul %x, %w : tensor<8x4xf32>, tensor<4x2xf32> -> tensor<8x2xf32>
      %l = dlopt.cross_entropy %h, %y : tensor<8x2xf32>, tensor<8xi32> -> tensor<f32>
      return %l : tensor<f32>
    }
    ```

    Elementwise binary ops broadcast like NumPy. Every op verifies its
    operand types and attributes and, where the operands determine it, infers
    its result type. `docs/ops.md` gives the exact numeric semantics that every
    backend implements.
  }];
  let cppNamespace = "::dlopt::dl";
  let dependentDialects = ["::mlir::arith::ArithDialect", "::mlir::func::FuncDialect"];
  let hasConstantMaterializer = 1;
  let hasOperationAttrVerify = 1;
  let hasRegionArgAttrVerify = 1;
  let hasRegionResultAttrVerify = 1;
  let extraClassDeclaration = [{
    /// Discardable attribute names used on functions, arguments and ops.
    static constexpr ::llvm::StringLiteral kParamAttr = "dlopt.param";
    static constexpr ::llvm::StringLiteral kInitAttr = "dlopt.init";
    static constexpr ::llvm::StringLiteral kInputAttr = "dlopt.input";
    static constexpr ::llvm::StringLiteral kOutputAttr = "dlopt.output";
    static constexpr ::llvm::StringLiteral kLossAttr = "dlopt.loss";
    static constexpr ::llvm::StringLiteral kLayerAttr = "dlopt.layer";
    static constexpr ::llvm::StringLiteral kGradAttr = "dlopt.grad";
    static constexpr ::llvm::StringLiteral kStateAttr = "dlopt.state";
    static constexpr ::llvm::StringLiteral kUpdateAttr = "dlopt.update";
    static constexpr ::llvm::StringLiteral kTrainStepAttr = "dlopt.train_step";
    /// Marks ops created by dlopt-autodiff (the backward pass).
    static constexpr ::llvm::StringLiteral kBackwardAttr = "dlopt.backward";
    /// Marks forward ops cloned by dlopt-recompute.
    static constexpr ::llvm::StringLiteral kRecomputeAttr = "dlopt.recompute";
    /// Stable op id: stamped by dlopt-check-model on every op of the model
    /// before the training transforms; the planner keys its plan by it.
    static constexpr ::llvm::StringLiteral kIdAttr = "dlopt.id";
    /// On ops the training transforms derive from forward op N (backward
    /// ops, recomputed clones, casts): N.
    static constexpr ::llvm::StringLiteral kFwdIdAttr = "dlopt.fwd_id";
    /// On ops dlopt-optimizer replays per micro-batch (accumulate > 1): the
    /// micro-batch, so that (dlopt.id, dlopt.mb) stays unique.
    static constexpr ::llvm::StringLiteral kMicroBatchAttr = "dlopt.mb";
    /// On forward ops: the pipeline stage the plan gives them (dlopt-compile
    /// writes it; dlopt-pipeline reads it). On the per-stage functions
    /// dlopt-pipeline makes: their stage.
    static constexpr ::llvm::StringLiteral kStageAttr = "dlopt.stage";
    /// On the running sums of accumulated micro-batches (dlopt-optimizer):
    /// the micro-batch each adds; keeps fusion from grouping the sums.
    static constexpr ::llvm::StringLiteral kAccumulateAttr = "dlopt.accumulate";
    /// On ZeRO-3's parameter gathers (dlopt-optimizer): the phase, "fwd" or
    /// "bwd", with ".mb<k>" per micro-batch; keeps them apart under CSE.
    static constexpr ::llvm::StringLiteral kZeroGatherAttr = "dlopt.zero_gather";
  }];
}

class DLOpt_Op<string mnemonic, list<Trait> traits = []>
    : Op<DLOpt_Dialect, mnemonic, traits>;

#endif // DLOPT_DIALECT_TD
