//===- dlopt-compile.cpp - Compile a dlopt model into a plan file ---------===//
//
// Parses and verifies a model, runs the compile pipeline (model checks,
// canonicalization, CSE) and writes the runtime executable ("plan file").
//
//===----------------------------------------------------------------------===//
#include "dialects/DLOpt/IR/DLOptDialect.h"
#include "passes/Export/ExportExecutable.h"
#include "passes/Export/GraphSummary.h"
#include "passes/ModelUtils.h"
#include "planner/Calibration.h"
#include "planner/Cluster.h"
#include "planner/OpSearch.h"
#include "planner/Plan.h"
#include "planner/Report.h"
#include "planner/Search.h"
#include "passes/Passes.h"
#include "runtime/format/Executable.h"
#include "runtime/exec/DataLoader.h"
#include "runtime/exec/World.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/Timer.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/raw_ostream.h"

#include <chrono>
#include <map>
#include <set>
#include <optional>

using namespace mlir;
namespace cl = llvm::cl;

static cl::OptionCategory category("dlopt-compile options");

static cl::opt<std::string> inputFile(cl::Positional, cl::Required,
                                      cl::desc("<model.mlir>"),
                                      cl::cat(category));
static cl::opt<std::string>
    outputFile("o", cl::value_desc("file"),
               cl::desc("Where to write the plan file (default: the input "
                        "with extension .plan; '-' for stdout)"),
               cl::cat(category));
static cl::opt<std::string>
    entry("entry", cl::value_desc("name"),
          cl::desc("Entry function (default: @main or the only public one)"),
          cl::cat(category));
enum class Emit { Plan, MLIR };
static cl::opt<Emit> emit(
    "emit", cl::desc("What to write"), cl::init(Emit::Plan),
    cl::values(clEnumValN(Emit::Plan, "plan", "the executable plan file (default)"),
               clEnumValN(Emit::MLIR, "mlir", "the IR after the compile pipeline")),
    cl::cat(category));
static cl::OptionCategory trainCategory("dlopt-compile training options");
static cl::opt<bool> autodiff("autodiff",
                              cl::desc("Differentiate the loss: the plan returns the loss and "
                                       "the gradient of every parameter"),
                              cl::cat(trainCategory));
static cl::opt<bool> train("train",
                           cl::desc("Build a training step: autodiff, gradient clipping, "
                                    "LR schedule and the optimizer update"),
                           cl::cat(trainCategory));
static cl::opt<std::string> optName("optimizer", cl::desc("sgd, adam or adamw (default adamw)"),
                                    cl::init("adamw"), cl::cat(trainCategory));
static cl::opt<double> lrOpt("lr", cl::desc("Peak learning rate (default 1e-3)"),
                             cl::init(1e-3), cl::cat(trainCategory));
static cl::opt<double> momentumOpt("momentum", cl::desc("SGD momentum (default 0)"),
                                   cl::init(0.0), cl::cat(trainCategory));
static cl::opt<bool> nesterovOpt("nesterov", cl::desc("SGD with Nesterov momentum"),
                                 cl::cat(trainCategory));
static cl::opt<double> weightDecayOpt(
    "weight-decay", cl::desc("Weight decay (default: 0.01 for adamw, 0 otherwise)"),
    cl::init(-1.0), cl::cat(trainCategory));
static cl::opt<double> beta1Opt("beta1", cl::desc("Adam beta1 (default 0.9)"),
                                cl::init(0.9), cl::cat(trainCategory));
static cl::opt<double> beta2Opt("beta2", cl::desc("Adam beta2 (default 0.999)"),
                                cl::init(0.999), cl::cat(trainCategory));
static cl::opt<double> epsOpt("adam-eps", cl::desc("Adam epsilon (default 1e-8)"),
                              cl::init(1e-8), cl::cat(trainCategory));
static cl::opt<std::string> scheduleOpt(
    "schedule", cl::desc("LR schedule after warmup: constant, cosine or linear"),
    cl::init("constant"), cl::cat(trainCategory));
static cl::opt<int64_t> warmupOpt("warmup-steps", cl::desc("Linear LR warmup steps"),
                                  cl::init(0), cl::cat(trainCategory));
static cl::opt<int64_t> totalStepsOpt(
    "total-steps", cl::desc("Steps at which cosine/linear decay reaches --min-lr"),
    cl::init(0), cl::cat(trainCategory));
static cl::opt<double> minLrOpt("min-lr", cl::desc("Final LR of the decay (default 0)"),
                                cl::init(0.0), cl::cat(trainCategory));
static cl::opt<double> clipOpt("clip-norm",
                               cl::desc("Clip gradients to this global L2 norm (0: off)"),
                               cl::init(0.0), cl::cat(trainCategory));
static cl::opt<bool> gradNormOpt(
    "grad-norm",
    cl::desc("Compute the global gradient norm each step and report it "
             "(default true); =false skips its pass over every gradient "
             "when no --clip-norm needs it"),
    cl::init(true), cl::cat(trainCategory));
static cl::opt<int64_t> accumulateOpt(
    "accumulate", cl::desc("Micro-batches per step (gradient accumulation); each "
                           "input gains a leading dim of this size"),
    cl::init(1), cl::cat(trainCategory));
static cl::opt<double> bucketMbOpt(
    "grad-bucket-mb",
    cl::desc("Data-parallel gradient all-reduces are fused into buckets of "
             "at most this many MiB, in backward order (0: one per gradient)"),
    cl::init(25.0), cl::cat(trainCategory));

static cl::opt<std::string> recomputeOpt(
    "recompute", cl::desc("Activation recomputation: none, selective, "
                          "elementwise, alternate or full"),
    cl::init("none"), cl::cat(trainCategory));
static cl::opt<std::string> precisionOpt(
    "precision", cl::desc("Compute precision: f32, bf16 or fp16 (fp32 master "
                          "weights; fp16 adds dynamic loss scaling); fp8 "
                          "with --dry-run only (a planning precision)"),
    cl::init("f32"), cl::cat(trainCategory));

static cl::OptionCategory planCategory("dlopt-compile planning options");
static cl::opt<std::string> clusterOpt(
    "cluster", cl::value_desc("spec"),
    cl::desc("Cluster to plan for: PRESET, PRESET:NODES (dgx-h100:16) or a "
             ".yaml/.yml/.json file (docs/cluster.md)"),
    cl::cat(planCategory));
static cl::opt<bool> dryRun(
    "dry-run", cl::desc("Plan the parallel layout on --cluster, print the "
                        "placement report to stdout, write no plan file"),
    cl::cat(planCategory));
static cl::opt<bool> verifyPlan(
    "verify-plan",
    cl::desc("After applying a plan, run the parallel step and the "
             "single-device step on the CPU backend on the same random "
             "batches and initial parameters, print the largest difference "
             "per tensor and fail above --verify-tolerance (parallel.md)"),
    cl::cat(planCategory));
static cl::opt<int> verifySteps(
    "verify-steps", cl::desc("Training steps --verify-plan runs (default 3)"),
    cl::init(3), cl::cat(planCategory));
static cl::opt<double> verifyTolerance(
    "verify-tolerance",
    cl::desc("Largest relative difference --verify-plan accepts (default "
             "1e-5)"),
    cl::init(1e-5), cl::cat(planCategory));
static cl::opt<std::string> fixOpt(
    "fix", cl::value_desc("k=v,..."),
    cl::desc("Pin planner choices: dp, tp, pp, cp, sp (0|1), mbs, mb, "
             "schedule (gpipe|1f1b|interleaved|zero-bubble), v, zero (0-3), "
             "recompute (none|selective|elementwise|alternate|full), layout "
             "(in-graph|hybrid|between-graph)"),
    cl::cat(planCategory));
static cl::opt<std::string> traceOpt(
    "trace", cl::value_desc("file"),
    cl::desc("Write the simulated timeline of the chosen plan's step as a "
             "Chrome trace JSON (open in ui.perfetto.dev)"),
    cl::cat(planCategory));
static cl::opt<std::string> planFileOpt(
    "plan", cl::value_desc("file"),
    cl::desc("A plan file from --dry-run --format json: check it against the "
             "model and re-price it (its cluster is embedded; --cluster "
             "overrides it)"),
    cl::cat(planCategory));
enum class Format { Text, Json };
static cl::opt<Format> formatOpt(
    "format", cl::desc("Dry-run report format"), cl::init(Format::Text),
    cl::values(clEnumValN(Format::Text, "text", "human-readable (default)"),
               clEnumValN(Format::Json, "json",
                          "the versioned plan file (docs/plan-report.md)")),
    cl::cat(planCategory));
static cl::opt<int> topK("top-k", cl::desc("Alternatives to show (default 3)"),
                         cl::init(3), cl::cat(planCategory));
static cl::opt<bool> explainOpt(
    "explain", cl::desc("Show the search: candidates priced and pruned, why"),
    cl::cat(planCategory));
static cl::list<std::string> calibrationOpt(
    "calibration", cl::value_desc("file"),
    cl::desc("JSON calibration constants over the defaults "
             "(docs/cost-model.md); repeatable, each file over the ones "
             "before it"),
    cl::cat(planCategory));
static cl::opt<int64_t> globalBatchOpt(
    "global-batch",
    cl::desc("Samples per training step to plan for (default: the model's "
             "batch)"),
    cl::init(0), cl::cat(planCategory));
static cl::opt<std::string> gradAccumOpt(
    "grad-accumulation", cl::value_desc("fp32|bf16"),
    cl::desc("Mixed precision: the dtype gradients are held in until the "
             "optimizer step, for the memory model (default fp32, as dlopt "
             "runs: 18 bytes per parameter with Adam; bf16 prices a "
             "framework that keeps 16-bit gradients, dry runs only)"),
    cl::init("fp32"), cl::cat(planCategory));
static cl::opt<std::string> attentionKernelOpt(
    "attention-kernel", cl::value_desc("fused|unfused"),
    cl::desc("How attention is priced: fused (default: dlopt's kernels, no "
             "score matrix kept) or unfused (Q K^T materialized, softmax and "
             "dropout over it, P V: Megatron-LM before FlashAttention, "
             "PyTorch's math attention; dry runs only)"),
    cl::init("fused"), cl::cat(planCategory));
static cl::opt<std::string> eagerKernelsOpt(
    "eager-kernels", cl::value_desc("norm,rope|norm|rope|none"),
    cl::desc("Price these as eager PyTorch's op sequences in fp32, one "
             "kernel per op (torchtitan without torch.compile: norm its "
             "RMSNorm, rope its rotary embedding), not dlopt's one fused "
             "kernel each (default none; dry runs only)"),
    cl::init("none"), cl::cat(planCategory));
static cl::opt<std::string> gradReduceOpt(
    "grad-reduce", cl::value_desc("bf16|fp32"),
    cl::desc("Mixed precision: the dtype data-parallel gradient syncs move "
             "(default: the compute dtype, as dlopt runs; fp32 prices a "
             "framework that reduces in fp32, such as FSDP with "
             "reduce_dtype=float32; dry runs only)"),
    cl::init(""), cl::cat(planCategory));

static cl::opt<bool> quiet("quiet", cl::desc("Do not print the summary"),
                           cl::cat(category));
static cl::opt<bool> timing("timing",
                            cl::desc("Print the time spent in each phase"),
                            cl::cat(category));

static std::string humanBytes(int64_t b) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  std::string s;
  llvm::raw_string_ostream os(s);
  os << llvm::format(u ? "%.2f %s" : "%.0f %s", v, units[u]);
  return s;
}

/// The executable a launch line runs: -o when given, else the model's file
/// name with .exe.
static std::string executableName() {
  if (!outputFile.empty() && outputFile != "-")
    return outputFile;
  llvm::SmallString<256> path(inputFile == "-" ? "model" : inputFile.getValue());
  llvm::sys::path::replace_extension(path, ".exe");
  return std::string(llvm::sys::path::filename(path));
}

/// --dry-run: summarize the forward graph, search the plan, print the report.
/// The training step is modelled from the forward graph (backward = the
/// calibration's backward_flops_ratio times the forward), so the compile
/// pipeline does not run.
///
/// With `apply` (plan application, no --dry-run), the same search runs but
/// its plan is stored there instead of reported; the choices that cannot be
/// applied yet are pinned to what can (docs/parallel.md).
static int runDryRun(ModuleOp module, dlopt::planner::Plan *apply = nullptr,
                     std::vector<dlopt::planner::CommOp> *applyComms = nullptr,
                     dlopt::planner::MemoryBreakdown *applyMemory = nullptr,
                     dlopt::rt::Prediction *applyPrediction = nullptr) {
  using namespace dlopt::planner;
  auto fail = [](const std::string &msg, int rc = 1) {
    llvm::errs() << "dlopt-compile: error: " << msg << "\n";
    return rc;
  };
  if (!dryRun && !apply)
    return fail(std::string(planFileOpt.empty() ? "" : "--plan: ") +
                    "--cluster, --fix, --plan, --trace, --format, --top-k, --explain, "
                    "--calibration and --global-batch need --dry-run "
                    "(emitting per-rank programs from a plan comes with plan "
                    "application and is not implemented yet)",
                2);
  std::optional<Plan> loaded;
  if (!planFileOpt.empty()) {
    auto lp = Plan::load(planFileOpt);
    if (!lp)
      return fail(lp.status().message());
    if (!fixOpt.empty())
      return fail("--plan and --fix cannot be combined: the plan file pins "
                  "every choice",
                  2);
    if (lp->training != (train || autodiff))
      return fail(planFileOpt + ": the plan is for a " +
                      (lp->training ? "training step (pass --train)"
                                    : "forward pass (drop --train)"),
                  2);
    loaded = std::move(*lp);
  }
  if (clusterOpt.empty() && !loaded)
    return fail(std::string(apply ? "applying a plan" : "--dry-run") +
                    " needs --cluster (a preset such as dgx-a100:2, or "
                    "a cluster file)",
                2);
  if (topK < 0)
    return fail("--top-k must be >= 0", 2);
  if (globalBatchOpt.getNumOccurrences() &&
      (globalBatchOpt < 1 || globalBatchOpt > kMaxGlobalBatch))
    return fail("--global-batch must be between 1 and " +
                    std::to_string(kMaxGlobalBatch) + ", got " +
                    std::to_string(globalBatchOpt),
                2);
  Expected<Cluster> cluster = loaded && clusterOpt.empty()
                                  ? Expected<Cluster>(loaded->cluster)
                                  : resolveCluster(clusterOpt.getValue());
  if (!cluster)
    return fail(cluster.status().message());
  if (loaded && !clusterOpt.empty()) {
    // --cluster overrides the plan's cluster; the plan's mesh must still
    // cover it.
    if (loaded->mesh.numDevices() != cluster->numDevices())
      return fail(planFileOpt + ": the plan is for " +
                      std::to_string(loaded->mesh.numDevices()) +
                      " devices (" + loaded->mesh.str() + "), but --cluster " +
                      clusterOpt + " has " +
                      std::to_string(cluster->numDevices()),
                  2);
  }
  Calibration cal;
  for (const std::string &path : calibrationOpt) {
    auto c = loadCalibration(path, cal);
    if (!c)
      return fail(c.status().message());
    cal = *c;
  }
  auto fix = parseFix(fixOpt.getValue());
  if (!fix)
    return fail(fix.status().message(), 2);
  // The plan's micro-batches are --accumulate's (or --fix mb=M): the
  // model's batch is one micro-batch, so the plan's global batch is M times
  // it, and every candidate is priced with M micro-batches, pipelined or
  // accumulated. --dry-run --accumulate M plans the step applying builds.
  const bool accumulating = accumulateOpt.getNumOccurrences() > 0;
  if (!loaded && (apply || accumulating)) {
    if (accumulating && fix->numMicroBatches &&
        *fix->numMicroBatches != accumulateOpt)
      return fail("--fix mb=" + std::to_string(*fix->numMicroBatches) +
                      " contradicts --accumulate " +
                      std::to_string(accumulateOpt) +
                      ": the plan's micro-batches are the accumulated "
                      "ones (give one of the two)",
                  2);
    if (!fix->numMicroBatches)
      fix->numMicroBatches = int64_t(accumulateOpt);
  }
  if (apply && !loaded) {
    // The planner chooses among what can be applied: data, tensor,
    // sequence and context parallelism, pipeline stages with any schedule,
    // any recomputation. ZeRO is applied when pinned (--fix zero=N); the
    // free search keeps it off, since its ZeRO pricing still favours stage
    // 3 too often. A pipeline needs the optimizer that closes it: with
    // --autodiff the search keeps pp=1.
    if (!fix->pp && !train)
      fix->pp = 1;
    if (!fix->zero) fix->zero = 0;
    // --recompute on the command line pins the plan's recomputation.
    if (!fix->recompute && recomputeOpt.getNumOccurrences())
      fix->recompute = parseRecompute(recomputeOpt.getValue());
  }
  // The same stable op ids dlopt-check-model stamps before the training
  // transforms: the plan keys its ops by them.
  {
    FailureOr<func::FuncOp> fn = dlopt::findEntryFunction(module, entry);
    if (failed(fn))
      return 1;
    dlopt::stampOpIds(*fn);
  }
  FailureOr<GraphSummary> graph = dlopt::summarizeGraph(module, entry);
  if (failed(graph))
    return 1;

  SearchOptions so;
  so.training = train || autodiff;
  so.globalBatch = globalBatchOpt;
  if ((apply || accumulating) && !loaded && !globalBatchOpt.getNumOccurrences() &&
      fix->numMicroBatches && *fix->numMicroBatches > 1)
    so.globalBatch = graph->batch * *fix->numMicroBatches;
  so.fix = *fix;
  if (loaded) {
    if (Status st = checkPlanMatchesModel(*loaded, *graph); !st.isOk())
      return fail(planFileOpt + ": " + st.message());
    if (globalBatchOpt.getNumOccurrences() &&
        globalBatchOpt != loaded->globalBatch)
      return fail(planFileOpt + ": the plan is for a global batch of " +
                      std::to_string(loaded->globalBatch) + ", not " +
                      std::to_string(globalBatchOpt),
                  2);
    // Applied, the model's batch is one micro-batch over the data-parallel
    // replicas: the plan's global batch must be that many micro-batches.
    if (apply && graph->batch > 0 && loaded->numMicroBatches > 0 &&
        graph->batch * loaded->numMicroBatches != loaded->globalBatch) {
      int64_t m = loaded->numMicroBatches;
      bool divides = loaded->globalBatch % m == 0;
      return fail(planFileOpt + ": the plan splits a global batch of " +
                      std::to_string(loaded->globalBatch) + " into " +
                      std::to_string(m) + " micro-batch" +
                      (m == 1 ? "" : "es") +
                      (divides ? " of " + std::to_string(loaded->globalBatch / m)
                               : std::string(", which does not divide it")) +
                      ", but the model's batch (one micro-batch) is " +
                      std::to_string(graph->batch) +
                      (divides ? ": generate the model with --batch " +
                                     std::to_string(loaded->globalBatch / m) +
                                     ", or plan a global batch of " +
                                     std::to_string(graph->batch * m)
                               : std::string()),
                  2);
    }
    so.globalBatch = loaded->globalBatch;
    so.fix = fixSpecOf(*loaded);
  }
  so.topK = topK;
  so.optimizer = optName == "sgd"
                     ? (momentumOpt != 0 ? Optimizer::Momentum : Optimizer::SGD)
                     : Optimizer::Adam;
  // Compute precision: --precision when given, else the model's dtype.
  std::string prec = precisionOpt.getNumOccurrences() ? precisionOpt.getValue()
                                                      : graph->dtype;
  if (loaded && !precisionOpt.getNumOccurrences())
    prec = loaded->model.precision;
  if (gradAccumOpt != "fp32" && gradAccumOpt != "bf16")
    return fail("--grad-accumulation=" + gradAccumOpt.getValue() +
                    " is not one of fp32, bf16",
                2);
  if (gradAccumOpt == "bf16" && apply)
    return fail("--grad-accumulation=bf16 prices 16-bit gradients, but "
                "dlopt accumulates gradients in fp32: use it with --dry-run "
                "only",
                2);
  if (prec == "fp8") {
    // A planning precision: fp8 GEMMs with bf16 weights, attention and
    // elementwise work (Transformer Engine's recipe), an fp8 copy of each
    // weight and the fp8 GEMM inputs kept for the backward pass, and the
    // scaling state (docs/cost-model.md, "fp8").
    so.precision = Precision::FP8;
    so.bytes.paramBytes = 3;
    so.bytes.gemmInputBytes = 1;
    so.bytes.fp8AmaxHistory = 1024;
  } else if (prec == "bf16") {
    so.precision = Precision::BF16;
  } else if (prec == "fp16" || prec == "f16") {
    so.precision = Precision::FP16;
  } else {
    so.precision = Precision::FP32;
    so.bytes.paramBytes = 4;
    so.bytes.gradReduceBytes = 4;
    so.bytes.masterWeights = false;
    so.bytes.activationBytes = 4;
  }
  if (so.precision != Precision::FP32 && gradAccumOpt == "bf16")
    so.bytes.gradBytes = 2;
  if (gradReduceOpt.getNumOccurrences()) {
    if (gradReduceOpt != "fp32" && gradReduceOpt != "bf16")
      return fail("--grad-reduce=" + gradReduceOpt.getValue() +
                      " is not one of bf16, fp32",
                  2);
    if (so.precision == Precision::FP32 && gradReduceOpt == "bf16")
      return fail("--grad-reduce=bf16 needs a 16-bit compute precision "
                  "(--precision bf16, fp16 or fp8)",
                  2);
    if (apply && gradReduceOpt == "fp32" && so.precision != Precision::FP32)
      return fail("--grad-reduce=fp32 prices gradient syncs in fp32, but "
                  "dlopt reduces gradients in the compute dtype: use it "
                  "with --dry-run only",
                  2);
    so.bytes.gradReduceBytes = gradReduceOpt == "fp32" ? 4 : 2;
  }
  // The option (main checked it: fused or unfused, unfused in dry runs
  // only), else a re-priced plan file's setting; a plan being applied runs
  // (and is priced with) dlopt's fused attention.
  so.bytes.unfusedAttention =
      attentionKernelOpt.getNumOccurrences()
          ? attentionKernelOpt == "unfused"
          : loaded && !apply && loaded->model.unfusedAttention;
  // The option (main checked it), else a re-priced plan file's setting.
  if (eagerKernelsOpt.getNumOccurrences()) {
    parseEagerKernels(eagerKernelsOpt, so.bytes.eagerNorm, so.bytes.eagerRope);
  } else if (loaded && !apply) {
    so.bytes.eagerNorm = loaded->model.eagerNorm;
    so.bytes.eagerRope = loaded->model.eagerRope;
  }
  // A plan file names its planner; otherwise transformers go to the layer
  // search and any other graph to the op-level one.
  const bool opLevel = loaded ? loaded->kind == PlanKind::OpLevel
                              : !graph->isTransformer();
  // Failures re-pricing a plan file say which file.
  const std::string planPrefix = loaded ? planFileOpt + ": " : "";
  if (opLevel) {
    // Per-op sharding rules and an ILP (planner/OpSearch.h).
    if (loaded && !optName.getNumOccurrences() &&
        !momentumOpt.getNumOccurrences())
      so.optimizer = loaded->optimizer;
    auto opPlan = searchOpPlan(*graph, *cluster, CostModel(cal), so);
    if (!opPlan)
      return fail(planPrefix + opPlan.status().message());
    if (apply) {
      *apply = loaded ? *loaded : opPlan->plan;
      if (applyComms)
        *applyComms = opPlan->comms;
      if (applyMemory)
        *applyMemory = opPlan->best.memory;
      if (applyPrediction)
        *applyPrediction = {cluster->name, opPlan->best.time.total(),
                            opPlan->best.memory.total()};
      return 0;
    }
    if (loaded) {
      std::string diff = comparePlans(*loaded, opPlan->plan);
      if (!diff.empty())
        llvm::errs() << "dlopt-compile: warning: " << planFileOpt << ": "
                     << diff << "\n";
    }
    ReportOptions ro;
    ro.explain = explainOpt;
    ro.executable = executableName();
    ro.calibration = &cal;
    llvm::outs() << (formatOpt == Format::Json
                         ? formatOpJsonReport(*opPlan, *cluster, *graph, ro)
                         : formatOpTextReport(*opPlan, *cluster, *graph, ro));
    return 0;
  }
  if (loaded && !optName.getNumOccurrences() &&
      !momentumOpt.getNumOccurrences())
    so.optimizer = loaded->optimizer;
  auto plan = searchPlan(*graph, *cluster, CostModel(cal), so);
  if (!plan)
    return fail(planPrefix + plan.status().message());
  if (apply) {
    *apply = loaded ? *loaded : plan->plan;
    if (applyComms)
      *applyComms = plan->comms;
    if (applyMemory)
      *applyMemory = plan->best.memory;
    if (applyPrediction)
      *applyPrediction = {cluster->name, plan->best.time.total(),
                          plan->best.memory.total()};
    return 0;
  }
  if (loaded) {
    std::string diff = comparePlans(*loaded, plan->plan);
    if (!diff.empty())
      llvm::errs() << "dlopt-compile: warning: " << planFileOpt << ": "
                   << diff << "\n";
  }
  if (!traceOpt.empty()) {
    if (!plan->simulated)
      return fail("--trace: no simulated timeline: " + plan->simError);
    std::error_code ec;
    llvm::raw_fd_ostream out(traceOpt, ec);
    if (ec)
      return fail("--trace: cannot write '" + traceOpt + "': " + ec.message());
    out << chromeTrace(*plan->simulated,
                       "dlopt plan " + plan->best.key() + " on " +
                           cluster->summary());
  }
  ReportOptions ro;
  ro.explain = explainOpt;
  ro.executable = executableName();
  ro.calibration = &cal;
  llvm::outs() << (formatOpt == Format::Json
                       ? formatJsonReport(*plan, *cluster, *graph, ro)
                       : formatTextReport(*plan, *cluster, *graph, ro));
  return 0;
}

/// Checks that `plan` can be applied today and writes its argument
/// shardings onto the entry function (`dlopt.sharding`) and its mesh (the
/// axes of size > 1, pp excluded) into meshAxes/meshSizes. Returns nonzero
/// after printing an error.
static int applyPlanToModule(ModuleOp module, const dlopt::planner::Plan &plan,
                             std::vector<std::string> &meshAxes,
                             std::vector<int64_t> &meshSizes) {
  using namespace dlopt::planner;
  auto fail = [](const std::string &msg) {
    llvm::errs() << "dlopt-compile: error: " << msg << "\n";
    return 2;
  };
  std::string what = planFileOpt.empty() ? std::string("the plan")
                                         : planFileOpt + ":";
  if (plan.pp() > 1 && !train)
    return fail(what + " " + plan.mesh.str() + " uses pipeline stages (pp=" +
                std::to_string(plan.pp()) +
                "), which need a training step: use --train (--autodiff "
                "builds no optimizer to close the pipeline)");
  if (planFileOpt.size() && accumulateOpt.getNumOccurrences() &&
      accumulateOpt != plan.numMicroBatches)
    return fail(what + " " + plan.mesh.str() + " has " +
                std::to_string(plan.numMicroBatches) +
                " micro-batches, but --accumulate is " +
                std::to_string(accumulateOpt));
  if (plan.zeroStage > 0) {
    // ZeRO shards what the data-parallel replicas (dp x cp ranks) hold
    // alike; the optimizer pass does it (docs/parallel.md).
    int64_t replicas = plan.mesh.size("dp") * plan.mesh.size("cp");
    if (replicas < 2)
      return fail(what + " " + plan.mesh.str() + " uses ZeRO stage " +
                  std::to_string(plan.zeroStage) +
                  ", which shards over the data-parallel replicas (dp x cp), "
                  "but it has dp=" + std::to_string(plan.mesh.size("dp")) +
                  " cp=" + std::to_string(plan.mesh.size("cp")) +
                  ": there is nothing to shard over; use zero=0 or dp >= 2");
    if (!train)
      return fail(what + " " + plan.mesh.str() + " uses ZeRO stage " +
                  std::to_string(plan.zeroStage) +
                  ", which shards the optimizer's state: it needs --train "
                  "(--autodiff builds no optimizer)");
  }
  FailureOr<func::FuncOp> fnOr = dlopt::findEntryFunction(module, entry);
  if (failed(fnOr))
    return 1;
  func::FuncOp fn = *fnOr;
  MLIRContext *ctx = module.getContext();
  auto keep = [&](const std::string &axis) {
    return axis != "pp" && plan.mesh.size(axis) > 1;
  };
  // Pipeline stages are cut by dlopt-pipeline, not partitioned.
  for (const MeshAxis &a : plan.mesh.axes())
    if (a.size > 1 && a.name != "pp") {
      meshAxes.push_back(a.name);
      meshSizes.push_back(a.size);
    }
  for (unsigned i = 0; i < fn.getNumArguments(); ++i) {
    StringAttr name = fn.getArgAttrOfType<StringAttr>(i, dlopt::dl::DLOptDialect::kParamAttr);
    if (!name)
      name = fn.getArgAttrOfType<StringAttr>(i, dlopt::dl::DLOptDialect::kInputAttr);
    if (!name)
      continue;
    const Sharding *s = plan.argSharding(name.getValue().str());
    if (!s)
      continue;
    if (!s->partial.empty())
      return fail(what + " argument '" + name.getValue().str() +
                  "' is planned as a partial sum " + s->str() +
                  "; arguments must be split or replicated");
    auto t = cast<RankedTensorType>(fn.getArgument(i).getType());
    if (s->rank() != t.getRank())
      return fail(what + " argument '" + name.getValue().str() + "' has " +
                  std::to_string(s->rank()) + " dims in the plan (" +
                  s->str() + ") but " + std::to_string(t.getRank()) +
                  " in the model");
    SmallVector<Attribute> dims;
    for (const auto &axes : s->split) {
      SmallVector<Attribute> list;
      for (const std::string &a : axes)
        if (keep(a))
          list.push_back(StringAttr::get(ctx, a));
      dims.push_back(ArrayAttr::get(ctx, list));
    }
    fn.setArgAttr(i, "dlopt.sharding", ArrayAttr::get(ctx, dims));
  }
  // What the plan requires of each forward op's operands and results
  // (sequence-parallel regions, gathers before column-parallel matmuls),
  // keyed by the stable op ids.
  auto toAttr = [&](const Sharding &s) {
    SmallVector<Attribute> dims, partial;
    for (const auto &axes : s.split) {
      SmallVector<Attribute> list;
      for (const std::string &a : axes)
        if (keep(a))
          list.push_back(StringAttr::get(ctx, a));
      dims.push_back(ArrayAttr::get(ctx, list));
    }
    for (const std::string &a : s.partial)
      if (keep(a))
        partial.push_back(StringAttr::get(ctx, a));
    return DictionaryAttr::get(
        ctx, {NamedAttribute(StringAttr::get(ctx, "split"), ArrayAttr::get(ctx, dims)),
              NamedAttribute(StringAttr::get(ctx, "partial"),
                             ArrayAttr::get(ctx, partial))});
  };
  llvm::DenseMap<int64_t, Operation *> byId;
  for (Operation &op : fn.getBody().front())
    if (auto id = op.getAttrOfType<IntegerAttr>(dlopt::dl::DLOptDialect::kIdAttr))
      byId[id.getInt()] = &op;
  for (const PlannedOp &po : plan.ops) {
    Operation *op = byId.lookup(po.id);
    if (!op)
      continue;
    if (op->getName().getStringRef() != po.op)
      return fail(what + " op " + std::to_string(po.id) + " is a " + po.op +
                  " in the plan but a " + op->getName().getStringRef().str() +
                  " in the model");
    if (plan.pp() > 1)
      op->setAttr(dlopt::dl::DLOptDialect::kStageAttr,
                  IntegerAttr::get(IntegerType::get(ctx, 64), po.stage));
    if (po.operands.size() != op->getNumOperands() ||
        po.results.size() != op->getNumResults())
      continue; // a plan that does not describe this op's operands
    SmallVector<Attribute> ops, res;
    for (const Sharding &s : po.operands)
      ops.push_back(toAttr(s));
    for (const Sharding &s : po.results)
      res.push_back(toAttr(s));
    op->setAttr("dlopt.plan",
                DictionaryAttr::get(
                    ctx, {NamedAttribute(StringAttr::get(ctx, "operands"),
                                         ArrayAttr::get(ctx, ops)),
                          NamedAttribute(StringAttr::get(ctx, "results"),
                                         ArrayAttr::get(ctx, res))}));
  }
  return 0;
}

/// The mesh axes of a collective the planner priced, from its label ("tp
/// all-reduce ...", "dp*cp gradient ...", "dp zero-3 parameter ...",
/// "embedding gradient ..." over pp).
static std::string pricedGroup(const dlopt::planner::CommOp &c) {
  std::string first = c.what.substr(0, c.what.find(' '));
  if (first == "dp*cp")
    return "dp+cp";
  if (first == "embedding")
    return "pp";
  return first;
}

/// Compares each rank program's planned arena (the memory it runs in:
/// parameters, states, inputs, constants and every temporary, packed by
/// lifetime) with the planner's per-device estimate for the same plan,
/// without the runtime reserve and fragmentation allowance (the arena holds
/// neither). The estimate must not be under the arena: that would be a
/// plan the planner thinks fits and that does not. Warns; returns the
/// number of warnings.
static int checkPlannedMemory(const dlopt::rt::Executable &exe,
                              const dlopt::planner::MemoryBreakdown &m) {
  double estimate = m.total() - m.workspace;
  int warnings = 0;
  for (size_t i = 0; i < exe.programs.size(); ++i) {
    double arena = double(exe.programs[i].memory.totalBytes());
    if (arena <= estimate)
      continue;
    ++warnings;
    llvm::errs() << llvm::formatv(
        "dlopt-compile: warning: program {0} runs in {1} of planned memory "
        "per rank, but the planner estimated {2} (params {3}, grads {4}, "
        "optimizer {5}, activations {6}, transient {7}, communication {8}; "
        "reserve excluded): the memory model under-estimates this step\n",
        i, humanBytes(int64_t(arena)), humanBytes(int64_t(estimate)),
        humanBytes(int64_t(m.params)), humanBytes(int64_t(m.grads)),
        humanBytes(int64_t(m.optimizer)), humanBytes(int64_t(m.activations)),
        humanBytes(int64_t(m.transient)), humanBytes(int64_t(m.commBuffers)));
  }
  return warnings;
}

/// Compares the collectives the partitioned step issues (kind, group, bytes
/// per step, as nccl-tests count them: the buffer for all-reduce, the
/// gathered size for all-gather and reduce-scatter) with the ones the
/// planner priced, per mesh axis, and warns about every (kind, axis) whose
/// bytes differ by
/// more than 10% or that only one side has, unless the difference is under
/// 2% of the group's traffic per step (vectors: a loss, a norm, a bias
/// gradient). Returns the number of warnings.
static int checkPricedCollectives(ModuleOp module,
                                  const std::vector<dlopt::planner::CommOp> &priced) {
  struct Row {
    double calls = 0, bytes = 0;
  };
  std::map<std::pair<std::string, std::string>, Row> inserted, planned;
  auto mesh = module->getAttrOfType<DictionaryAttr>("dlopt.mesh");
  if (!mesh)
    return 0;
  auto axes = cast<ArrayAttr>(mesh.get("axes"));
  auto bytesOf = [](Type t) {
    auto rt = cast<RankedTensorType>(t);
    return double(rt.getNumElements()) *
           std::max<unsigned>(1, rt.getElementTypeBitWidth() / 8);
  };
  module.walk([&](Operation *op) {
    auto ga = op->getAttrOfType<DenseI16ArrayAttr>("grid_axes");
    if (!ga || isa<shard::AllSliceOp>(op) || op->getNumResults() != 1)
      return;
    std::string group;
    for (int16_t a : ga.asArrayRef())
      group += (group.empty() ? "" : "+") +
               cast<StringAttr>(axes[size_t(a)]).getValue().str();
    std::string kind = isa<shard::AllReduceOp>(op)       ? "all-reduce"
                       : isa<shard::AllGatherOp>(op)     ? "all-gather"
                       : isa<shard::ReduceScatterOp>(op) ? "reduce-scatter"
                       : isa<shard::AllToAllOp>(op)      ? "all-to-all"
                                                         : op->getName().stripDialect().str();
    double b = isa<shard::ReduceScatterOp>(op) ? bytesOf(op->getOperand(0).getType())
                                               : bytesOf(op->getResult(0).getType());
    // The plan prices the step's micro-batches (--accumulate's): a
    // collective replayed per micro-batch counts once per copy, as there.
    for (llvm::StringRef a : llvm::split(group, '+')) {
      Row &r = inserted[{kind, a.str()}];
      r.calls += 1;
      r.bytes += b;
    }
  });
  // A collective over several axes (the planner's dp*cp gradient sum, or
  // dlopt-partition's fold of a sum over dp then tp) counts on each axis.
  for (const dlopt::planner::CommOp &c : priced) {
    std::string kind = dlopt::planner::collectiveName(c.collective);
    std::string group = pricedGroup(c);
    for (llvm::StringRef a : llvm::split(group, '+')) {
      // The planner names dp*cp even where dp is 1 (no such mesh axis).
      if (!llvm::any_of(axes, [&](Attribute x) {
            return cast<StringAttr>(x).getValue() == a;
          }))
        continue;
      Row &r = planned[{kind, a.str()}];
      r.calls += c.calls;
      r.bytes += c.bytes * c.calls;
    }
  }
  std::map<std::string, double> insertedTotal, plannedTotal;
  std::set<std::pair<std::string, std::string>> keys;
  for (auto &[k, r] : inserted) {
    insertedTotal[k.second] += r.bytes;
    keys.insert(k);
  }
  for (auto &[k, r] : planned) {
    plannedTotal[k.second] += r.bytes;
    keys.insert(k);
  }
  auto kib = [](double b) { return llvm::formatv("{0:F1} KiB", b / 1024).str(); };
  int warnings = 0;
  for (const auto &k : keys) {
    Row in = inserted.count(k) ? inserted[k] : Row{};
    Row pr = planned.count(k) ? planned[k] : Row{};
    double hi = std::max(in.bytes, pr.bytes), lo = std::min(in.bytes, pr.bytes);
    double traffic = std::max(insertedTotal[k.second], plannedTotal[k.second]);
    if (hi <= 1.1 * lo || hi - lo < 0.02 * traffic)
      continue;
    ++warnings;
    llvm::errs() << "dlopt-compile: warning: " << k.first << " over " << k.second
                 << ": the step issues " << int64_t(in.calls) << " call(s), "
                 << kib(in.bytes) << " per step; the plan priced "
                 << int64_t(pr.calls + 0.5) << " call(s), " << kib(pr.bytes)
                 << "\n";
  }
  return warnings;
}

/// --verify-plan: runs `par` (the applied plan, ranks as threads) and `one`
/// (the single-device step) for --verify-steps steps on the same synthetic
/// global batches and parameters, and compares every output each step and
/// every parameter and state at the end: max|a - b| / (max|b| + 1e-6), with
/// gradients and optimizer states measured against the largest of their
/// kind in the model (some are 0 up to rounding). Returns the exit code.
static int runVerifyPlan(const dlopt::rt::Executable &par,
                         const dlopt::rt::Executable &one) {
  using namespace dlopt::rt;
  auto fail = [](const std::string &msg) {
    llvm::errs() << "dlopt-compile: error: --verify-plan: " << msg << "\n";
    return 1;
  };
  if (verifySteps < 1 || verifySteps > 1000)
    return fail("--verify-steps must be between 1 and 1000");
  // Every rank holds its program's memory in this process.
  double bytes = 0;
  for (const Program &p : par.programs)
    bytes += double(p.memory.totalBytes()) * double(p.ranks.size());
  bytes += double(one.programs[0].memory.totalBytes());
  if (bytes > 16.0 * (1ull << 30))
    return fail(llvm::formatv("the two steps need {0:F1} GiB here; verify "
                              "on a smaller preset of the model",
                              bytes / (1ull << 30))
                    .str());
  WorldOptions wo;
  wo.seed = 1234;
  auto wp = World::create(par, wo);
  if (!wp)
    return fail("parallel step: " + wp.status().message());
  auto w1 = World::create(one, wo);
  if (!w1)
    return fail("single-device step: " + w1.status().message());
  std::vector<std::string> inputNames;
  for (int32_t id : one.inputs)
    inputNames.push_back(one.values[size_t(id)].name);
  auto loader = createSyntheticLoader(one, inputNames, 0);
  if (!loader)
    return fail(loader.status().message());
  for (World *w : {wp->get(), w1->get()})
    if (Status st = w->initializeParams(); !st.isOk())
      return fail(st.message());
  const char *kinds[] = {"grad.",    "sgd.momentum.", "adamw.m.",
                         "adamw.v.", "adam.m.",       "adam.v."};
  auto kindOf = [&](const std::string &n) -> const char * {
    for (const char *k : kinds)
      if (llvm::StringRef(n).starts_with(k))
        return k;
    return nullptr;
  };
  auto maxAbs = [](const HostTensor &t) {
    double m = 0;
    for (int64_t i = 0; i < t.numElements(); ++i)
      m = std::max(m, std::abs(t.elementAsDouble(i)));
    return m;
  };
  // Params Adam updates: their update divides each gradient element by its
  // own magnitude, so elements whose gradient is rounding noise (a key
  // bias, which cannot change softmax) move by up to lr either way in
  // either run. They are reported, not judged, and the steps after the
  // first inherit those moves: the verdict takes every output of step 1
  // but them, and the loss of every step at 10x the tolerance.
  std::set<std::string> adamUpdated;
  for (int32_t id : one.states) {
    llvm::StringRef n(one.values[size_t(id)].name);
    for (llvm::StringRef pre : {"adam.m.", "adamw.m."})
      if (n.starts_with(pre))
        adamUpdated.insert(n.drop_front(pre.size()).str());
  }
  std::map<std::string, double> worst; // tensor -> largest relative diff
  double verdict = 0;
  std::string verdictOf;
  auto judge = [&](const std::string &n, double rel) {
    if (rel > verdict || verdictOf.empty()) {
      verdict = rel;
      verdictOf = n;
    }
  };
  int stepNow = 0;
  auto compare = [&](const std::vector<std::pair<std::string, HostTensor>> &a,
                     const std::vector<std::pair<std::string, HostTensor>> &b)
      -> std::string {
    std::map<std::string, double> scale;
    for (auto &[n, t] : b)
      if (const char *k = kindOf(n))
        scale[k] = std::max(scale[k], maxAbs(t));
    for (size_t i = 0; i < a.size(); ++i) {
      const auto &[n, ta] = a[i];
      const HostTensor &tb = b[i].second;
      if (ta.type.shape != tb.type.shape)
        return n + ": shape differs";
      double d = 0;
      bool finite = true;
      for (int64_t j = 0; j < ta.numElements(); ++j) {
        double x = ta.elementAsDouble(j), y = tb.elementAsDouble(j);
        finite &= std::isfinite(x) == std::isfinite(y);
        d = std::max(d, std::abs(x - y));
      }
      const char *k = kindOf(n);
      double rel = finite ? d / ((k ? scale[k] : maxAbs(tb)) + 1e-6)
                          : std::numeric_limits<double>::infinity();
      worst[n] = std::max(worst[n], rel);
      if (stepNow == 1 && !adamUpdated.count(n))
        judge(n + " (step 1)", rel);
      if (n == "loss" && stepNow > 1)
        judge("loss (step " + std::to_string(stepNow) + ", 10x tolerance)",
              rel / 10);
    }
    return "";
  };
  for (int step = 0; step < verifySteps; ++step) {
    stepNow = step + 1;
    auto batch = (*loader)->batch(uint64_t(step), 99);
    if (!batch)
      return fail(batch.status().message());
    for (World *w : {wp->get(), w1->get()})
      for (const NamedTensor &t : *batch)
        if (Status st = w->bind(t.name, t.tensor, "verify"); !st.isOk())
          return fail(st.message());
    for (World *w : {wp->get(), w1->get()})
      if (Status st = w->execute(); !st.isOk())
        return fail((w == wp->get() ? "parallel step: " : "single-device step: ") +
                    st.message());
    std::vector<std::pair<std::string, HostTensor>> a, b;
    for (const std::string &n : one.outputNames) {
      auto x = (*wp)->readOutput(n);
      auto y = (*w1)->readOutput(n);
      if (!x || !y)
        return fail(n + ": " + (!x ? x.status() : y.status()).message());
      a.emplace_back(n, std::move(*x));
      b.emplace_back(n, std::move(*y));
    }
    if (std::string e = compare(a, b); !e.empty())
      return fail(e);
    for (World *w : {wp->get(), w1->get()})
      if (Status st = w->applyUpdates(); !st.isOk())
        return fail(st.message());
  }
  stepNow = 0;
  // The parameters and states after the last step (reported).
  std::vector<std::pair<std::string, HostTensor>> a, b;
  for (auto ids : {&one.params, &one.states})
    for (int32_t id : *ids) {
      const std::string &n = one.values[size_t(id)].name;
      auto x = (*wp)->readArgument(n);
      auto y = (*w1)->readArgument(n);
      if (!x || !y)
        return fail(n + ": " + (!x ? x.status() : y.status()).message());
      a.emplace_back("final " + n, std::move(*x));
      b.emplace_back("final " + n, std::move(*y));
    }
  if (std::string e = compare(a, b); !e.empty())
    return fail(e);
  std::vector<std::pair<double, std::string>> rows;
  for (auto &[n, d] : worst)
    rows.emplace_back(d, n);
  llvm::sort(rows, [](auto &x, auto &y) { return x.first > y.first; });
  llvm::outs() << "verify-plan: " << int(verifySteps) << " step(s) of "
               << par.worldSize << " ranks against 1 device on the CPU "
               << "backend, same batches and initial parameters\n"
               << "  largest relative difference per tensor (worst first):\n";
  for (auto &[d, n] : rows) {
    llvm::StringRef base(n);
    base.consume_front("final ");
    llvm::outs() << llvm::formatv("    {0,-40} {1:e2}{2}\n", n, d,
                                  adamUpdated.count(base.str())
                                      ? "  (Adam-updated: reported, not judged)"
                                      : "");
  }
  bool ok = !verdictOf.empty() && verdict <= verifyTolerance;
  llvm::outs() << llvm::formatv("verify-plan: {0}: largest judged difference "
                                "{1:e2} ({2}) {3} the tolerance {4:e1}\n",
                                ok ? "ok" : "FAILED", verdict, verdictOf,
                                ok ? "<=" : ">", double(verifyTolerance));
  return ok ? 0 : 1;
}

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  // The fusion switches are declared with the pipeline (passes/Pipelines.cpp)
  // so every tool has it; list it with the training options here.
  {
    auto &registered = cl::getRegisteredOptions();
    for (const char *name : {"fuse-elementwise", "merge-fused-elementwise",
                             "fold-batch-reductions"}) {
      auto it = registered.find(name);
      if (it != registered.end())
        it->second->addCategory(trainCategory);
    }
  }
  cl::HideUnrelatedOptions({&category, &trainCategory, &planCategory});
  cl::ParseCommandLineOptions(
      argc, argv,
      "dlopt-compile: verify a dlopt model and compile it into a plan file\n\n"
      "  dlopt-compile model.mlir -o model.plan\n");

  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  auto phase = [&](const char *name) {
    if (!timing)
      return;
    auto t1 = Clock::now();
    llvm::errs() << llvm::format(
        "  %-10s %8.3f s\n", name,
        std::chrono::duration<double>(t1 - t0).count());
    t0 = t1;
  };

  DialectRegistry registry;
  registry.insert<dlopt::dl::DLOptDialect, func::FuncDialect,
                  arith::ArithDialect, shard::ShardDialect>();
  MLIRContext context(registry);
  context.loadAllAvailableDialects();
  // Diagnostics point at the source; never dump the whole module.
  context.printOpOnDiagnostic(false);

  std::string err;
  auto file = openInputFile(inputFile, &err);
  if (!file) {
    llvm::errs() << "dlopt-compile: error: " << err << "\n";
    return 1;
  }
  llvm::SourceMgr sourceMgr;
  sourceMgr.AddNewSourceBuffer(std::move(file), llvm::SMLoc());
  SourceMgrDiagnosticHandler diagHandler(sourceMgr, &context);
  OwningOpRef<ModuleOp> module = parseSourceFile<ModuleOp>(sourceMgr, &context);
  if (!module)
    return 1;
  phase("parse");

  // Enumerated options are checked in every mode: a dry run must not price
  // a misspelt --precision as fp32.
  auto oneOf = [](llvm::StringRef flag, llvm::StringRef value,
                  std::initializer_list<llvm::StringRef> allowed) {
    if (llvm::is_contained(allowed, value))
      return true;
    llvm::errs() << "dlopt-compile: error: --" << flag << "=" << value
                 << " is not one of";
    for (llvm::StringRef a : allowed)
      llvm::errs() << " " << a;
    llvm::errs() << "\n";
    return false;
  };
  // Checked in every mode, so a misspelt value is never ignored.
  if (attentionKernelOpt != "fused" && attentionKernelOpt != "unfused") {
    llvm::errs() << "dlopt-compile: error: --attention-kernel="
                 << attentionKernelOpt << " is not one of fused, unfused\n";
    return 2;
  }
  if (attentionKernelOpt == "unfused" && !dryRun) {
    llvm::errs() << "dlopt-compile: error: --attention-kernel=unfused prices "
                    "materialized attention scores, but dlopt's backends run "
                    "fused attention: use it with --dry-run only\n";
    return 2;
  }
  {
    bool norm = false, rope = false;
    if (!dlopt::planner::parseEagerKernels(eagerKernelsOpt, norm, rope)) {
      llvm::errs() << "dlopt-compile: error: --eager-kernels="
                   << eagerKernelsOpt
                   << " is not a list of norm and rope (or none)\n";
      return 2;
    }
    if ((norm || rope) && !dryRun) {
      llvm::errs() << "dlopt-compile: error: --eager-kernels="
                   << eagerKernelsOpt
                   << " prices eager PyTorch's kernels, but dlopt's backends "
                      "run fused kernels: use it with --dry-run only\n";
      return 2;
    }
  }
  if (precisionOpt == "fp8" && !dryRun) {
    llvm::errs() << "dlopt-compile: error: --precision fp8 is a planning "
                    "precision: dlopt's backends have no fp8 kernels (use it "
                    "with --dry-run)\n";
    return 2;
  }
  // fp8 is a planning precision: dry runs only (checked above).
  const bool precisionOk =
      dryRun ? oneOf("precision", precisionOpt, {"f32", "bf16", "fp16", "fp8"})
             : oneOf("precision", precisionOpt, {"f32", "bf16", "fp16"});
  if (!precisionOk ||
      !oneOf("recompute", recomputeOpt,
             {"none", "full", "selective", "elementwise", "alternate"}) ||
      !oneOf("optimizer", optName, {"sgd", "adam", "adamw"}) ||
      !oneOf("schedule", scheduleOpt, {"constant", "cosine", "linear"}))
    return 2;

  // Plan application (docs/parallel.md): a plan for several devices (the
  // planner's choice on --cluster, with --fix pins, or a --plan file)
  // compiles to a multi-rank executable.
  std::vector<std::string> meshAxes;
  std::vector<int64_t> meshSizes;
  std::vector<dlopt::planner::CommOp> pricedComms;
  dlopt::planner::MemoryBreakdown pricedMemory;
  std::optional<dlopt::rt::Prediction> prediction;
  int zeroStage = 0;
  int64_t pipelineStages = 1, virtualStages = 1, planMicroBatches = 0;
  std::string pipelineSchedule = "1f1b";
  bool applying = !dryRun && (!clusterOpt.empty() || !fixOpt.empty() ||
                              !planFileOpt.empty());
  OwningOpRef<ModuleOp> singleDevice;
  if (verifyPlan && !applying) {
    llvm::errs() << "dlopt-compile: error: --verify-plan needs a plan to "
                    "apply (--cluster, --fix or --plan, without --dry-run)\n";
    return 2;
  }
  if (applying && verifyPlan)
    singleDevice = OwningOpRef<ModuleOp>(module->clone());
  if (applying) {
    if (!train && !autodiff) {
      llvm::errs() << "dlopt-compile: error: applying a plan (--cluster, "
                      "--fix or --plan without --dry-run) needs --train (or "
                      "--autodiff)\n";
      return 2;
    }
    dlopt::planner::Plan plan;
    dlopt::rt::Prediction predicted;
    if (int rc = runDryRun(*module, &plan, &pricedComms, &pricedMemory,
                           &predicted))
      return rc;
    prediction = predicted;
    phase("plan");
    if (applyPlanToModule(*module, plan, meshAxes, meshSizes))
      return 2;
    zeroStage = plan.zeroStage;
    pipelineStages = plan.pp();
    virtualStages = plan.virtualStages;
    pipelineSchedule = dlopt::planner::scheduleName(plan.schedule);
    // The plan's micro-batches are the step's: pipelined, or accumulated.
    planMicroBatches = plan.numMicroBatches;
    // The plan's recomputation is applied (dlopt-recompute, per layer).
    std::string planned = dlopt::planner::recomputeName(plan.recompute);
    if (recomputeOpt.getNumOccurrences() && recomputeOpt != planned) {
      llvm::errs() << "dlopt-compile: error: --recompute " << recomputeOpt
                   << " contradicts the plan's recompute=" << planned
                   << " (drop --recompute, or pin it in the plan)\n";
      return 2;
    }
    recomputeOpt = planned;
  }

  if (dryRun || formatOpt.getNumOccurrences() || explainOpt ||
      !traceOpt.empty() || (!calibrationOpt.empty() && !applying) ||
      topK.getNumOccurrences() || globalBatchOpt.getNumOccurrences() ||
      gradAccumOpt != "fp32" || gradReduceOpt.getNumOccurrences()) {
    int rc = runDryRun(*module);
    phase("plan");
    return rc;
  }

  PassManager pm(&context);
  dlopt::CompilePipelineOptions options;
  options.entry = entry;
  options.autodiff = autodiff;
  options.train = train;
  options.optimizer.optimizer = optName;
  options.optimizer.lr = lrOpt;
  options.optimizer.momentum = momentumOpt;
  options.optimizer.nesterov = nesterovOpt;
  options.optimizer.weightDecay = weightDecayOpt;
  options.optimizer.beta1 = beta1Opt;
  options.optimizer.beta2 = beta2Opt;
  options.optimizer.eps = epsOpt;
  options.optimizer.schedule = scheduleOpt;
  options.optimizer.warmupSteps = warmupOpt;
  options.optimizer.totalSteps = totalStepsOpt;
  options.optimizer.minLr = minLrOpt;
  options.optimizer.clipNorm = clipOpt;
  options.optimizer.gradNorm = gradNormOpt;
  options.optimizer.accumulate =
      planMicroBatches > 0 ? planMicroBatches : int64_t(accumulateOpt);
  options.pipelineStages = pipelineStages;
  options.virtualStages = virtualStages;
  options.schedule = pipelineSchedule;
  options.optimizer.zero = zeroStage;
  options.optimizer.bucketMb = bucketMbOpt;
  options.recompute = recomputeOpt;
  options.precision = precisionOpt;
  options.meshAxes = meshAxes;
  options.meshSizes = meshSizes;
  if (!train && !autodiff &&
      (recomputeOpt != "none" || precisionOpt != "f32")) {
    llvm::errs() << "dlopt-compile: error: --recompute and --precision need "
                    "--train or --autodiff\n";
    return 2;
  }
  dlopt::buildCompilePipeline(pm, options);
  if (failed(pm.run(*module)))
    return 1;
  phase("pipeline");
  // Pipelined steps are not compared yet: the planner prices one stage's
  // collectives and its p2p per micro-batch (docs/parallel.md).
  if (applying && !meshAxes.empty() && pipelineStages == 1)
    checkPricedCollectives(*module, pricedComms);

  std::string out = outputFile;
  if (out.empty()) {
    llvm::SmallString<256> path(inputFile == "-" ? "model" : inputFile.getValue());
    llvm::sys::path::replace_extension(path, emit == Emit::MLIR ? ".opt.mlir" : ".plan");
    out = std::string(path);
  }

  if (emit == Emit::MLIR) {
    auto output = openOutputFile(out, &err);
    if (!output) {
      llvm::errs() << "dlopt-compile: error: " << err << "\n";
      return 1;
    }
    module->print(output->os());
    output->os() << "\n";
    output->keep();
    return 0;
  }

  FailureOr<dlopt::rt::Executable> exe =
      dlopt::exportExecutable(*module, entry, inputFile);
  if (failed(exe))
    return 1;
  phase("export");

  exe->prediction = prediction;
  auto bytes = dlopt::rt::serializeExecutable(*exe);
  if (!bytes) {
    llvm::errs() << "dlopt-compile: error: " << bytes.status().message() << "\n";
    return 1;
  }
  auto output = openOutputFile(out, &err);
  if (!output) {
    llvm::errs() << "dlopt-compile: error: " << err << "\n";
    return 1;
  }
  output->os().write(reinterpret_cast<const char *>(bytes->data()),
                     bytes->size());
  output->keep();
  phase("write");

  if (applying && exe->worldSize > 1)
    checkPlannedMemory(*exe, pricedMemory);
  if (!quiet && out != "-") {
    // With one program per pipeline stage: the one with the largest arena.
    size_t largest = 0;
    for (size_t p = 1; p < exe->programs.size(); ++p)
      if (exe->programs[p].memory.totalBytes() >
          exe->programs[largest].memory.totalBytes())
        largest = p;
    const auto &mem = exe->programs[largest].memory;
    llvm::errs() << "dlopt-compile: wrote " << out << ": "
                 << (exe->programs.size() > 1
                         ? std::to_string(exe->programs.size()) +
                               " programs, the largest "
                         : std::string())
                 << exe->programs[largest].instrs.size() << " instructions, "
                 << exe->params.size() << " params, " << exe->inputs.size()
                 << " inputs; planned memory " << humanBytes(mem.totalBytes())
                 << " (persistent " << humanBytes(mem.persistentBytes)
                 << ", scratch " << humanBytes(mem.scratchBytes) << ")\n";
  }
  if (singleDevice) {
    // The same model, options and seed on one device.
    PassManager pm1(&context);
    dlopt::CompilePipelineOptions single = options;
    single.meshAxes.clear();
    single.meshSizes.clear();
    single.optimizer.zero = 0;
    single.pipelineStages = 1;
    dlopt::buildCompilePipeline(pm1, single);
    if (failed(pm1.run(*singleDevice)))
      return 1;
    FailureOr<dlopt::rt::Executable> one =
        dlopt::exportExecutable(*singleDevice, entry, inputFile);
    if (failed(one))
      return 1;
    int rc = runVerifyPlan(*exe, *one);
    phase("verify");
    return rc;
  }
  return 0;
}
