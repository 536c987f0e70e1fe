//===- Pipelines.cpp - The compile pipeline and pass registration ---------===//
#include "passes/Passes.h"

#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;

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
  }
  if (options.train) {
    OptimizerPassOptions opt = options.optimizer;
    opt.entry = options.entry;
    pm.addPass(createOptimizerPass(opt));
  }
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());
  // After the last CSE, which would merge the recomputed copies back.
  if ((options.autodiff || options.train) && options.recompute != "none") {
    RecomputePassOptions rc;
    rc.entry = options.entry;
    rc.policy = options.recompute;
    pm.addPass(createRecomputePass(rc));
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
                                llvm::cl::desc("none, full or selective"),
                                llvm::cl::init("none")};
  Option<std::string> precision{*this, "precision",
                                llvm::cl::desc("f32, bf16 or fp16"),
                                llvm::cl::init("f32")};
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
        buildCompilePipeline(pm, o);
      });
}
