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
  pm.addPass(createCSEPass());
}

namespace {
struct PipelineOptions : public PassPipelineOptions<PipelineOptions> {
  Option<std::string> entry{*this, "entry",
                            llvm::cl::desc("Entry function name"),
                            llvm::cl::init("")};
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
        buildCompilePipeline(pm, o);
      });
}
