//===- Passes.h - dlopt passes and pipelines ------------------------------===//
#pragma once

#include "mlir/Dialect/Shard/IR/ShardDialect.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassManager.h"

namespace dlopt {

#define GEN_PASS_DECL
#include "passes/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/Passes.h.inc"

/// Options of the compile pipeline shared by dlopt-compile and dlopt-opt.
struct CompilePipelineOptions {
  std::string entry;
  /// Differentiate the loss (dlopt-autodiff): the step returns gradients.
  bool autodiff = false;
  /// Build a full training step: autodiff plus dlopt-optimizer.
  bool train = false;
  OptimizerPassOptions optimizer;
  /// Activation recomputation policy: none, full or selective.
  std::string recompute = "none";
  /// Compute precision: f32, bf16 or fp16 (fp16 adds dynamic loss scaling).
  std::string precision = "f32";
  /// Outline chains of elementwise ops into dlopt.fused_elementwise groups
  /// (dlopt-fuse-elementwise), run last; applies to training steps
  /// (autodiff/train). The `--fuse-elementwise=false` command-line flag
  /// turns it off too.
  bool fuseElementwise = true;
  /// After fusion, merge independent groups with the same per-element
  /// program into multi-tensor groups (dlopt-merge-fused-elementwise): one
  /// instruction for all optimizer updates. `--merge-fused-elementwise=false`
  /// turns it off too.
  bool mergeFusedElementwise = true;
  /// After the optimizer, compute batch-summed weight gradients as one GEMM
  /// and reductions over size-1 dims as reshapes
  /// (dlopt-fold-batch-reductions). `--fold-batch-reductions=false` turns
  /// it off too.
  bool foldBatchReductions = true;
  /// dlopt-fold-loss-casts: cross-entropy on the narrow logits (no f32
  /// copies) in mixed-precision training.
  bool foldLossCasts = true;
  /// The device mesh a plan is applied to (dlopt-partition, after autodiff
  /// and before the optimizer): axis names and sizes, major first. Empty (or
  /// all sizes 1) compiles the single-device step. Argument shardings come
  /// from `dlopt.sharding` attributes on the entry function.
  std::vector<std::string> meshAxes;
  std::vector<int64_t> meshSizes;
  /// Pipeline stages (dlopt-pipeline, after recomputation and before
  /// fusion): > 1 cuts the training step into one function per stage, by
  /// the `dlopt.stage` of its forward ops, ordered by `schedule` over the
  /// optimizer's `accumulate` micro-batches.
  int64_t pipelineStages = 1;
  int64_t virtualStages = 1;
  std::string schedule = "1f1b";
};

/// Builds the pipeline that `dlopt-compile` runs before export: model
/// checks, then (with autodiff/train) the training transforms, then
/// canonicalization and CSE, then elementwise fusion. Registered as `dlopt-compile-pipeline`.
void buildCompilePipeline(mlir::OpPassManager &pm,
                          const CompilePipelineOptions &options);

/// Registers every dlopt pass and the named pipelines.
void registerAllPasses();

} // namespace dlopt
