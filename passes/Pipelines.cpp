//===- Pipelines.cpp - The compile pipeline and pass registration ---------===//
#include "passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/Support/CommandLine.h"

using namespace mlir;

/// `--fuse-elementwise=false` turns elementwise fusion off in every tool that
/// builds the compile pipeline (dlopt-compile included) without each tool
/// declaring the flag; CompilePipelineOptions::fuseElementwise turns it off
/// programmatically and the named pipeline's `fuse-elementwise` option in
/// dlopt-opt.
static llvm::cl::opt<bool> clFuseElementwise(
    "fuse-elementwise",
    llvm::cl::desc("Fuse chains of elementwise ops of a training step into "
                   "fused_elementwise instructions (default true)"),
    llvm::cl::init(true));
/// `--merge-fused-elementwise=false` keeps one instruction per fused group
/// (no multi-tensor groups); the same mechanism as `--fuse-elementwise`.
static llvm::cl::opt<bool> clMergeFusedElementwise(
    "merge-fused-elementwise",
    llvm::cl::desc("Merge independent fused groups that run the same "
                   "per-element program (e.g. every parameter's optimizer "
                   "update) into one multi-tensor instruction (default true)"),
    llvm::cl::init(true));

/// `--fold-batch-reductions=false` keeps weight gradients as batched
/// products summed over the batch (dlopt-fold-batch-reductions off); the
/// same mechanism as `--fuse-elementwise`.
static llvm::cl::opt<bool> clFoldBatchReductions(
    "fold-batch-reductions",
    llvm::cl::desc("Compute batch-summed weight gradients as one GEMM and "
                   "reductions over size-1 dims as reshapes (default true)"),
    llvm::cl::init(true));

/// `--fold-loss-casts=false` keeps the f32 copies of the logits and of
/// their gradient around cross-entropy (dlopt-fold-loss-casts off).
static llvm::cl::opt<bool> clFoldLossCasts(
    "fold-loss-casts",
    llvm::cl::desc("Cross-entropy reads bf16/f16 logits itself, without f32 "
                   "copies of the logits and their gradient (default true)"),
    llvm::cl::init(true));

void dlopt::buildCompilePipeline(OpPassManager &pm,
                                 const CompilePipelineOptions &options) {
  CheckModelPassOptions check;
  check.entry = options.entry;
  pm.addPass(createCheckModelPass(check));
  pm.addPass(createCanonicalizerPass());
  if ((options.autodiff || options.train) && options.precision != "f32") {
    MixedPrecisionPassOptions mp;
    mp.entry = options.entry;
    mp.precision = options.precision;
    pm.addPass(createMixedPrecisionPass(mp));
  }
  if (options.autodiff || options.train) {
    AutodiffPassOptions ad;
    ad.entry = options.entry;
    pm.addPass(createAutodiffPass(ad));
    if (llvm::any_of(options.meshSizes, [](int64_t s) { return s > 1; })) {
      PartitionPassOptions pp;
      pp.entry = options.entry;
      pp.axes.assign(options.meshAxes.begin(), options.meshAxes.end());
      pp.sizes.assign(options.meshSizes.begin(), options.meshSizes.end());
      pm.addPass(createPartitionPass(pp));
    }
  }
  if (options.train) {
    OptimizerPassOptions opt = options.optimizer;
    opt.entry = options.entry;
    if (options.pipelineStages > 1)
      opt.markMicroBatches = true;
    pm.addPass(createOptimizerPass(opt));
  }
  pm.addPass(createCanonicalizerPass());
  // Weight gradients as one GEMM over the flattened batch (after
  // partitioning: the rows it merges are this rank's).
  if ((options.autodiff || options.train) && options.foldBatchReductions &&
      clFoldBatchReductions)
    pm.addNestedPass<func::FuncOp>(createFoldBatchReductionsPass());
  if ((options.autodiff || options.train) && options.precision != "f32" &&
      options.foldLossCasts && clFoldLossCasts)
    pm.addNestedPass<func::FuncOp>(createFoldLossCastsPass());
  // Stable ids make every op's attributes unique: merge equal ops first.
  pm.addNestedPass<func::FuncOp>(createIdentityCSEPass());
  pm.addPass(createCSEPass());
  // After the last CSE, which would merge the recomputed copies back.
  if ((options.autodiff || options.train) && options.recompute != "none") {
    RecomputePassOptions rc;
    rc.entry = options.entry;
    rc.policy = options.recompute;
    pm.addPass(createRecomputePass(rc));
  }
  if (options.train && options.pipelineStages > 1) {
    PipelinePassOptions pp;
    pp.entry = options.entry;
    pp.stages = options.pipelineStages;
    pp.virtualStages = options.virtualStages;
    pp.schedule = options.schedule;
    pp.microBatches = options.optimizer.accumulate;
    pm.addPass(createPipelinePass(pp));
  }
  // Last: fusion outlines ops that the transforms above pattern-match.
  // Training steps only for now (forward-only compiles keep one instruction
  // per op; see docs/dlopt-compile.md).
  if (options.fuseElementwise && clFuseElementwise &&
      (options.autodiff || options.train)) {
    pm.addNestedPass<func::FuncOp>(createFuseElementwisePass());
    if (options.mergeFusedElementwise && clMergeFusedElementwise)
      pm.addNestedPass<func::FuncOp>(createMergeFusedElementwisePass());
  }
}

namespace {
struct PipelineOptions : public PassPipelineOptions<PipelineOptions> {
  Option<std::string> entry{*this, "entry",
                            llvm::cl::desc("Entry function name"),
                            llvm::cl::init("")};
  Option<bool> autodiff{*this, "autodiff",
                        llvm::cl::desc("Differentiate the loss"),
                        llvm::cl::init(false)};
  Option<bool> train{*this, "train",
                     llvm::cl::desc("Build a training step (autodiff + optimizer)"),
                     llvm::cl::init(false)};
  Option<std::string> optimizer{*this, "optimizer", llvm::cl::desc("sgd, adam or adamw"),
                                llvm::cl::init("adamw")};
  Option<double> lr{*this, "lr", llvm::cl::desc("Learning rate"), llvm::cl::init(1e-3)};
  Option<std::string> recompute{*this, "recompute",
                                llvm::cl::desc("none, selective, elementwise, alternate or full"),
                                llvm::cl::init("none")};
  Option<std::string> precision{*this, "precision",
                                llvm::cl::desc("f32, bf16 or fp16"),
                                llvm::cl::init("f32")};
  Option<bool> fuseElementwise{
      *this, "fuse-elementwise",
      llvm::cl::desc("Fuse elementwise chains of training steps"),
      llvm::cl::init(true)};
  Option<bool> foldBatchReductions{
      *this, "fold-batch-reductions",
      llvm::cl::desc("Weight gradients as one GEMM over the flattened batch"),
      llvm::cl::init(true)};
  Option<bool> foldLossCasts{
      *this, "fold-loss-casts",
      llvm::cl::desc("Cross-entropy on the narrow logits, without f32 copies"),
      llvm::cl::init(true)};
  Option<bool> mergeFusedElementwise{
      *this, "merge-fused-elementwise",
      llvm::cl::desc("Merge fused groups with one program into multi-tensor "
                     "groups"),
      llvm::cl::init(true)};
};
} // namespace

void dlopt::registerAllPasses() {
  registerDLOptPasses();
  PassPipelineRegistration<PipelineOptions>(
      "dlopt-compile-pipeline",
      "The pipeline dlopt-compile runs before exporting a plan file",
      [](OpPassManager &pm, const PipelineOptions &opts) {
        CompilePipelineOptions o;
        o.entry = opts.entry;
        o.autodiff = opts.autodiff;
        o.train = opts.train;
        o.optimizer.optimizer = opts.optimizer;
        o.optimizer.lr = opts.lr;
        o.recompute = opts.recompute;
        o.precision = opts.precision;
        o.fuseElementwise = opts.fuseElementwise;
        o.mergeFusedElementwise = opts.mergeFusedElementwise;
        o.foldBatchReductions = opts.foldBatchReductions;
        o.foldLossCasts = opts.foldLossCasts;
        buildCompilePipeline(pm, o);
      });
}
