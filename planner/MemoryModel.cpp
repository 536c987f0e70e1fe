//===- MemoryModel.cpp - Model states, activations, buffers ---------------===//
#include "planner/MemoryModel.h"

#include <algorithm>
#include <cstdio>

namespace dlopt::planner {

const char *optimizerName(Optimizer o) {
  switch (o) {
  case Optimizer::SGD:
    return "sgd";
  case Optimizer::Momentum:
    return "momentum";
  case Optimizer::Adam:
    return "adam";
  }
  return "?";
}

const char *scheduleName(PipelineSchedule s) {
  switch (s) {
  case PipelineSchedule::GPipe:
    return "gpipe";
  case PipelineSchedule::OneFOneB:
    return "1f1b";
  case PipelineSchedule::Interleaved1F1B:
    return "interleaved-1f1b";
  case PipelineSchedule::ZeroBubble:
    return "zero-bubble";
  }
  return "?";
}

//===----------------------------------------------------------------------===//
// Model states (ZeRO, Rajbhandari et al. 2020)
//===----------------------------------------------------------------------===//

double optimizerStepBytesPerParam(Optimizer optimizer,
                                  const PrecisionConfig &pr) {
  const double moments = optimizer == Optimizer::Adam       ? 2
                         : optimizer == Optimizer::Momentum ? 1
                                                            : 0;
  const double weights = pr.masterWeights
                             ? 2 * pr.masterBytes + pr.paramBytes
                             : 2 * pr.paramBytes;
  return pr.gradBytes + 2 * moments * pr.optimizerStateBytes + weights;
}

Expected<StateMemory> stateMemory(double paramsOnDevice, int dp, int zeroStage,
                                  Optimizer optimizer,
                                  const PrecisionConfig &pr) {
  if (!(paramsOnDevice >= 0))
    return Status::error("expected a parameter count >= 0, got " +
                         std::to_string(paramsOnDevice));
  if (dp < 1)
    return Status::error("expected dp >= 1, got " + std::to_string(dp));
  if (zeroStage < 0 || zeroStage > 3)
    return Status::error("expected a ZeRO stage from 0 to 3, got " +
                         std::to_string(zeroStage));
  if (!(pr.paramBytes > 0) || !(pr.gradBytes > 0) ||
      !(pr.gradReduceBytes > 0) || !(pr.masterBytes > 0) ||
      !(pr.optimizerStateBytes > 0) || !(pr.activationBytes > 0))
    return Status::error("expected positive bytes per element in the "
                         "precision config");
  int moments = optimizer == Optimizer::Adam       ? 2
                : optimizer == Optimizer::Momentum ? 1
                                                   : 0;
  double optPerParam = moments * pr.optimizerStateBytes +
                       (pr.masterWeights ? pr.masterBytes : 0.0);
  StateMemory s;
  s.params = paramsOnDevice * pr.paramBytes / (zeroStage >= 3 ? dp : 1);
  s.grads = paramsOnDevice * pr.gradBytes / (zeroStage >= 2 ? dp : 1);
  s.optimizer = paramsOnDevice * optPerParam / (zeroStage >= 1 ? dp : 1);
  return s;
}

//===----------------------------------------------------------------------===//
// Transformer shape
//===----------------------------------------------------------------------===//

double gradBuckets(double grads, int zeroStage, int replicas,
                   const PrecisionConfig &pr, double bucketBytes) {
  double whole = grads * (zeroStage >= 2 ? replicas : 1);
  if (pr.gradBytes > 0)
    whole *= pr.gradReduceBytes / pr.gradBytes;
  return std::min(2 * bucketBytes, whole);
}

double zeroThreeBuffers(double unitParams, double gradShard, int replicas,
                        const PrecisionConfig &pr, double bucketBytes) {
  double whole = gradShard * replicas;
  if (pr.gradBytes > 0)
    whole *= pr.gradReduceBytes / pr.gradBytes;
  const double bucket = bucketBytes > 0 ? std::min(bucketBytes, whole) : whole;
  return 2 * unitParams * pr.paramBytes + 2 * bucket;
}

double TransformerSpec::layerParams() const {
  double h = hidden, f = ffn();
  return 4 * h * h + 2 * h * f + 9 * h + f;
}

double TransformerSpec::embeddingParams() const {
  return static_cast<double>(vocab) * hidden +
         (learnedPositions ? static_cast<double>(seqLen) * hidden : 0.0);
}

double TransformerSpec::totalParams() const {
  return numLayers * layerParams() + embeddingParams() + 2.0 * hidden +
         (tiedEmbeddings ? 0.0 : static_cast<double>(vocab) * hidden);
}

Status TransformerSpec::validate() const {
  auto pos = [](const char *name, int64_t v) -> Status {
    if (v > 0)
      return Status::ok();
    return Status::error(std::string("transformer: expected ") + name +
                         " > 0, got " + std::to_string(v));
  };
  DLOPT_RETURN_IF_ERROR(pos("layers", numLayers));
  DLOPT_RETURN_IF_ERROR(pos("hidden", hidden));
  DLOPT_RETURN_IF_ERROR(pos("heads", heads));
  DLOPT_RETURN_IF_ERROR(pos("sequence length", seqLen));
  DLOPT_RETURN_IF_ERROR(pos("vocab", vocab));
  if (ffnHidden < 0)
    return Status::error("transformer: expected ffn hidden >= 0, got " +
                         std::to_string(ffnHidden));
  if (hidden % heads != 0)
    return Status::error("transformer: hidden " + std::to_string(hidden) +
                         " is not divisible by the " + std::to_string(heads) +
                         " heads");
  return Status::ok();
}

//===----------------------------------------------------------------------===//
// Activations (Korthikanti et al. 2022) and schedules
//===----------------------------------------------------------------------===//

double activationBytesPerLayer(const TransformerSpec &spec,
                               const TrainingConfig &cfg) {
  const double h = spec.hidden, t = cfg.tp, cp = std::max(1, cfg.cp);
  const double sbh = spec.seqLen / cp * cfg.microBatchSize * h;
  const double e = cfg.precision.activationBytes;
  const double eg = cfg.precision.gemmInputBytes > 0
                        ? cfg.precision.gemmInputBytes
                        : e;
  const bool sp = cfg.sequenceParallel;
  if (cfg.recompute == RecomputePolicy::Full)
    return e * sbh / (sp ? t : 1);
  const double kvShare = double(spec.kv()) / double(spec.heads);
  const double w = double(spec.tpWidth()) / h;
  const double g = spec.gatedMlp ? 4 : 2;
  // GEMM inputs: the two norm outputs (gathered over tp with SP), the
  // attention output, the MLP's last input. The rest: the layer input and
  // the residual (split with SP), q, k and v (k and v gathered over cp),
  // the MLP's other values. Selective and elementwise recomputation keep
  // the shards of what tp and cp gather and gather them again in the
  // backward pass; elementwise keeps no norm output and, of the MLP, only
  // its matmuls' outputs (the GELU's input; gate and up): g/2 of its
  // values. Alternate (dlopt-recompute) also re-runs the second, fourth
  // and sixth matmuls of a pre-norm layer (q, k, v, out, gate or fc1, up
  // or fc2, down): k, the attention's out projection unless tp reduces
  // its output (then its reduced output stays), up (a GPT layer's fc2
  // output is read by no backward op). It keeps the layer input, q, v,
  // the attention output and the MLP's first matmul output.
  const bool alternate = cfg.recompute == RecomputePolicy::Alternate;
  const bool elementwise =
      cfg.recompute == RecomputePolicy::Elementwise || alternate;
  const bool selective =
      cfg.recompute == RecomputePolicy::Selective || elementwise;
  const bool regather = sp && selective;
  const double normOutputs = elementwise ? 0 : regather ? 2 / t : 2;
  const double gemmInputs = normOutputs + 1 / t + (elementwise ? 0 : w / t);
  const double residual = sp ? 1 / t : 1;
  const double others =
      alternate ? residual + (t > 1 ? residual : 0) + (1 + kvShare) / t + w / t
                : 2 * residual + (1 + 2 * kvShare * (selective ? 1 : cp)) / t +
                      (elementwise ? g / 2 : g - 1) * w / t;
  return sbh * (eg * gemmInputs + e * others) +
         attentionScoreElements(spec, cfg) *
             attentionScoreBytesKept(spec, cfg) +
         eagerNormBytesKept(spec, cfg);
}

std::string eagerKernelsName(bool norm, bool rope) {
  if (norm && rope)
    return "norm,rope";
  return norm ? "norm" : rope ? "rope" : "none";
}

bool parseEagerKernels(std::string_view s, bool &norm, bool &rope) {
  norm = rope = false;
  if (s == "none")
    return true;
  if (s.empty())
    return false;
  while (true) {
    const size_t comma = s.find(',');
    const std::string_view item = s.substr(0, comma);
    bool &flag = item == "norm" ? norm : rope;
    if ((item != "norm" && item != "rope") || flag)
      return false;
    flag = true;
    if (comma == std::string_view::npos)
      return true;
    s = s.substr(comma + 1);
  }
}

double eagerNormBytesKept(const TransformerSpec &spec,
                          const TrainingConfig &cfg) {
  // Only what none and selective keep: elementwise, alternate and full
  // recomputation run the norms again in the backward pass (torchtitan's
  // selective op policy saves matmul and attention outputs).
  if (!cfg.precision.eagerNorm || !spec.rmsNorm ||
      (cfg.recompute != RecomputePolicy::None &&
       cfg.recompute != RecomputePolicy::Selective))
    return 0;
  const double cp = std::max(1, cfg.cp);
  const double sbh =
      spec.seqLen / cp * cfg.microBatchSize * double(spec.hidden);
  // Each RMS norm keeps x.float() (pow's and the mul's input), which takes
  // the place of the fused norm's input x (the layer's input and residual,
  // kept as e bytes): 4 - e more; and the normalized value cast back (the
  // weight's mul's input), e: 4 bytes an element a norm.
  return sbh * 2 * 4 / (cfg.sequenceParallel ? cfg.tp : 1);
}

double attentionScoreElements(const TransformerSpec &spec,
                              const TrainingConfig &cfg) {
  if (!cfg.precision.unfusedAttention)
    return 0;
  const double cp = std::max(1, cfg.cp);
  return double(cfg.microBatchSize) * double(spec.heads) / cfg.tp *
         (double(spec.seqLen) / cp) * double(spec.seqLen);
}

double attentionScoreBytesKept(const TransformerSpec &spec,
                               const TrainingConfig &cfg) {
  if (!cfg.precision.unfusedAttention)
    return 0;
  const double e = cfg.precision.activationBytes;
  switch (cfg.recompute) {
  case RecomputePolicy::None:
    return e + (spec.dropout ? 1 + e : 0);
  case RecomputePolicy::Elementwise:
  case RecomputePolicy::Alternate:
    return e;
  case RecomputePolicy::Selective:
  case RecomputePolicy::Full:
    return 0;
  }
  return 0;
}

double microBatchesInFlight(const TrainingConfig &cfg, int stage) {
  double m = cfg.numMicroBatches, p = cfg.pp, v = cfg.virtualStages;
  switch (cfg.schedule) {
  case PipelineSchedule::GPipe:
    return m;
  case PipelineSchedule::OneFOneB:
    return std::min(p - stage, m);
  case PipelineSchedule::ZeroBubble:
    // ZB-H1 keeps a micro-batch's activations until its deferred weight
    // gradient: stage s defers s W passes, so every stage holds up to pp.
    return std::min(p, m);
  case PipelineSchedule::Interleaved1F1B:
    // Narayanan et al. 2021: stage 0 holds p (1 + (p-1)/(p v)) micro-batches
    // worth of its layers; later stages hold fewer, stage 0 bounds them.
    return std::min(p * (1 + (p - 1) / (p * v)), m);
  }
  return m;
}

int64_t layersOnStage(const TransformerSpec &spec, int pp, int stage) {
  int64_t base = spec.numLayers / pp, extra = spec.numLayers % pp;
  return base + (stage < extra ? 1 : 0);
}

std::vector<int64_t> interleavedChunkLayers(int64_t layers, int pp, int v) {
  const int64_t chunks = int64_t(pp) * std::max(1, v);
  std::vector<int64_t> n(chunks, chunks > 0 ? layers / chunks : 0);
  for (int64_t j = 0; chunks > 0 && j < layers % chunks; ++j)
    ++n[j];
  return n;
}

int64_t layersOnStage(const TransformerSpec &spec, const TrainingConfig &cfg,
                      int stage) {
  if (!cfg.stageLayerCounts.empty() && stage >= 0 &&
      stage < int(cfg.stageLayerCounts.size()))
    return cfg.stageLayerCounts[stage];
  return layersOnStage(spec, cfg.pp, stage);
}

//===----------------------------------------------------------------------===//
// Per-stage breakdown
//===----------------------------------------------------------------------===//

namespace {

Status checkConfig(const TransformerSpec &spec, const TrainingConfig &cfg) {
  DLOPT_RETURN_IF_ERROR(spec.validate());
  auto atLeast1 = [](const char *name, int64_t v) -> Status {
    if (v >= 1)
      return Status::ok();
    return Status::error(std::string("expected ") + name + " >= 1, got " +
                         std::to_string(v));
  };
  DLOPT_RETURN_IF_ERROR(atLeast1("dp", cfg.dp));
  DLOPT_RETURN_IF_ERROR(atLeast1("tp", cfg.tp));
  DLOPT_RETURN_IF_ERROR(atLeast1("pp", cfg.pp));
  DLOPT_RETURN_IF_ERROR(atLeast1("cp", cfg.cp));
  DLOPT_RETURN_IF_ERROR(atLeast1("the micro-batch size", cfg.microBatchSize));
  DLOPT_RETURN_IF_ERROR(
      atLeast1("the number of micro-batches", cfg.numMicroBatches));
  DLOPT_RETURN_IF_ERROR(atLeast1("virtual stages", cfg.virtualStages));
  if (cfg.zeroStage < 0 || cfg.zeroStage > 3)
    return Status::error("expected a ZeRO stage from 0 to 3, got " +
                         std::to_string(cfg.zeroStage));
  if (spec.heads % cfg.tp != 0)
    return Status::error("tp=" + std::to_string(cfg.tp) +
                         " does not divide the " + std::to_string(spec.heads) +
                         " attention heads");
  if (spec.tpWidth() % cfg.tp != 0)
    return Status::error("tp=" + std::to_string(cfg.tp) +
                         " does not divide the ffn hidden size " +
                         std::to_string(spec.tpWidth()));
  if (cfg.sequenceParallel && spec.seqLen % cfg.tp != 0)
    return Status::error("sequence parallelism: tp=" + std::to_string(cfg.tp) +
                         " does not divide the sequence length " +
                         std::to_string(spec.seqLen));
  if (cfg.cp > 1 && spec.seqLen % (2 * int64_t(cfg.cp)) != 0)
    return Status::error("context parallelism: 2*cp = " +
                         std::to_string(2 * cfg.cp) +
                         " (two load-balanced chunks per rank) does not "
                         "divide the sequence length " +
                         std::to_string(spec.seqLen));
  if (cfg.sequenceParallel && cfg.cp > 1 &&
      (spec.seqLen / cfg.cp) % cfg.tp != 0)
    return Status::error("sequence parallelism: tp=" + std::to_string(cfg.tp) +
                         " does not divide the " +
                         std::to_string(spec.seqLen / cfg.cp) +
                         " tokens of a context-parallel rank");
  if (spec.numLayers < cfg.pp)
    return Status::error("pp=" + std::to_string(cfg.pp) + " needs at least " +
                         std::to_string(cfg.pp) + " layers, got " +
                         std::to_string(spec.numLayers));
  if (cfg.schedule == PipelineSchedule::Interleaved1F1B &&
      spec.numLayers < static_cast<int64_t>(cfg.pp) * cfg.virtualStages)
    return Status::error("interleaved 1F1B: pp=" + std::to_string(cfg.pp) +
                         " x v=" + std::to_string(cfg.virtualStages) +
                         " model chunks need at least " +
                         std::to_string(int64_t(cfg.pp) * cfg.virtualStages) +
                         " layers, got " + std::to_string(spec.numLayers));
  if (!cfg.stageLayerCounts.empty()) {
    if (int(cfg.stageLayerCounts.size()) != cfg.pp)
      return Status::error(
          "the stage split has " + std::to_string(cfg.stageLayerCounts.size()) +
          " entries, expected pp=" + std::to_string(cfg.pp));
    int64_t sum = 0;
    for (size_t i = 0; i < cfg.stageLayerCounts.size(); ++i) {
      if (cfg.stageLayerCounts[i] < 1)
        return Status::error("the stage split gives stage " +
                             std::to_string(i) + " " +
                             std::to_string(cfg.stageLayerCounts[i]) +
                             " layers, expected at least 1");
      sum += cfg.stageLayerCounts[i];
    }
    if (sum != spec.numLayers)
      return Status::error("the stage split covers " + std::to_string(sum) +
                           " layers, expected " +
                           std::to_string(spec.numLayers));
  }
  return Status::ok();
}

/// Parameters of one layer held by one tensor-parallel rank: the column- and
/// row-parallel matrices and the column-parallel biases are split by t; the
/// row-parallel biases (2h) and layer norms (4h) are replicated.
double layerParamsPerTpRank(const TransformerSpec &spec, int tp) {
  double h = spec.hidden, f = spec.ffn();
  return (4 * h * h + 2 * h * f + 3 * h + f) / tp + 6 * h;
}

} // namespace

Expected<MemoryBreakdown> transformerStageMemory(const TransformerSpec &spec,
                                                 const TrainingConfig &cfg,
                                                 int stage,
                                                 const Calibration &cal) {
  return transformerStageMemoryWithLayers(spec, cfg, stage,
                                          layersOnStage(spec, cfg, stage), cal);
}

Expected<MemoryBreakdown>
transformerStageMemoryWithLayers(const TransformerSpec &spec,
                                 const TrainingConfig &cfg, int stage,
                                 int64_t layersHere, const Calibration &cal) {
  DLOPT_RETURN_IF_ERROR(checkConfig(spec, cfg));
  if (layersHere < 1)
    return Status::error("a pipeline stage needs at least 1 layer, got " +
                         std::to_string(layersHere));
  if (stage < 0 || stage >= cfg.pp)
    return Status::error("stage " + std::to_string(stage) +
                         " is out of range for pp=" + std::to_string(cfg.pp));
  const double h = spec.hidden, v = spec.vocab;
  const double s = double(spec.seqLen) / cfg.cp; // tokens on this rank
  const double b = cfg.microBatchSize, t = cfg.tp;
  const bool first = stage == 0, last = stage == cfg.pp - 1;
  const double spDiv = cfg.sequenceParallel ? t : 1.0;
  // The embedding table and the LM head are split on the vocabulary over
  // tp when it divides (TransformerSharding), else replicated.
  const double vLocal = spec.vocab % cfg.tp == 0 ? v / t : v;
  const PrecisionConfig &pr = cfg.precision;

  // Parameters this device holds before ZeRO.
  const double layers = double(layersHere);
  double params = layers * layerParamsPerTpRank(spec, cfg.tp);
  if (first)
    params += vLocal * h + (spec.learnedPositions ? spec.seqLen * h : 0.0);
  if (last) {
    params += 2 * h; // final layer norm
    if (cfg.pp > 1 || !spec.tiedEmbeddings)
      params += vLocal * h; // output matrix (a tied copy when pp > 1)
  }
  // fp8: each of a layer's GEMMs (q, k, v and the output projection, and
  // the MLP's two, three when gated) scales its input, weight and output
  // gradient, each with an amax history, a scale and its inverse (fp32),
  // replicated like the layer's norms.
  const double layerGemms = 4 + (spec.gatedMlp ? 3 : 2);
  const double fp8Scaling =
      layers * layerGemms * 3 *
      (pr.fp8AmaxHistory > 0 ? pr.fp8AmaxHistory + 2 : 0) * 4;
  // ZeRO shards over the dp * cp ranks that hold the same parameters.
  auto states =
      stateMemory(params, cfg.dp * cfg.cp, cfg.zeroStage, cfg.optimizer, pr);
  if (!states)
    return states.status();

  MemoryBreakdown m;
  m.stage = stage;
  m.params = states->params + fp8Scaling;
  m.grads = states->grads;
  m.optimizer = states->optimizer;

  // Activations kept for the backward pass.
  double act = activationBytesPerLayer(spec, cfg);
  const double e = pr.activationBytes;
  double inflight = microBatchesInFlight(cfg, stage);
  m.activations = inflight * layers * act;
  // The last stage: the final norm's input (split with SP) and output
  // (gathered for the head), the logits and their gradient, which the loss
  // kernel forms while the logits are alive.
  if (last)
    m.activations += microBatchesInFlight(cfg, cfg.pp - 1) * e *
                     (s * b * h * (1 / spDiv + 1) + 2 * s * b * vLocal);
  // An eager final RMS norm keeps its fp32 copies too (4 bytes an element
  // more, eagerNormBytesKept), whatever the layers recompute.
  if (last && pr.eagerNorm && spec.rmsNorm)
    m.activations +=
        microBatchesInFlight(cfg, cfg.pp - 1) * 4 * s * b * h / spDiv;

  // Working set of one layer's backward when its activations are
  // recomputed: what it recomputes lives during it, at most the whole
  // layer's (the "none" row) for full and elementwise recomputation.
  if (cfg.recompute == RecomputePolicy::Full ||
      cfg.recompute == RecomputePolicy::Elementwise ||
      cfg.recompute == RecomputePolicy::Alternate) {
    TrainingConfig noRecompute = cfg;
    noRecompute.recompute = RecomputePolicy::None;
    m.transient = activationBytesPerLayer(spec, noRecompute);
  } else if (cfg.recompute == RecomputePolicy::Selective) {
    // The norm outputs gathered again over tp (SP), the keys and values
    // over cp, during one layer's backward.
    const double eg = pr.gemmInputBytes > 0 ? pr.gemmInputBytes : e;
    const double kvShare = double(spec.kv()) / double(spec.heads);
    if (cfg.sequenceParallel && cfg.tp > 1)
      m.transient += 2 * eg * s * b * h;
    if (cfg.cp > 1)
      m.transient += 2 * e * s * b * h * kvShare * cfg.cp / t;
    // Unfused attention: the probabilities (and the dropout's mask and
    // output) recomputed for one layer's backward.
    TrainingConfig noRecompute = cfg;
    noRecompute.recompute = RecomputePolicy::None;
    m.transient += attentionScoreElements(spec, cfg) *
                   attentionScoreBytesKept(spec, noRecompute);
  }
  // Unfused attention's backward: the gradients of the probabilities and
  // of the scores, one layer's at a time.
  m.transient += 2 * e * attentionScoreElements(spec, cfg);

  // The end of the backward pass, when every gradient is held and the
  // embedding table's is being formed (dlopt's autodiff builds it whole):
  // the lookup's gradient (a scatter into a zeroed table) exists beside
  // the table's reduced gradient; with the LM head tied on the same stage,
  // its partial and their sum as well, and under ZeRO >= 2 (gradients
  // held as shards) the whole sum is not among them; with several
  // micro-batches, the sum so far too. Measured against
  // dlopt's memory plans (docs/parallel.md, "Planned memory against the
  // planner").
  if (first || last) {
    // A table tied across pipeline stages has its per-stage sums formed
    // whole (dlopt builds a vocabulary-parallel table's gradient whole and
    // slices it), before the tp slice.
    const double table =
        (spec.tiedEmbeddings && cfg.pp > 1 ? v : vLocal) * h * pr.gradBytes;
    const bool tiedHere = spec.tiedEmbeddings && first && last;
    double tables = tiedHere ? (cfg.zeroStage >= 2 ? 3 : 2) : 1;
    // Accumulated over micro-batches (gradient accumulation, or a
    // pipeline's): the sum so far (or, under ZeRO >= 2, the other stage's
    // term of a tied table before the reduce-scatter) is held while the
    // next micro-batch's table is formed and added to it.
    if (cfg.numMicroBatches > 1)
      tables += 1;
    // A table tied across stages under ZeRO >= 2 (each micro-batch's
    // gradient reduce-scattered, so dlopt cannot sum it per stage first):
    // each micro-batch's head gradient crosses to the first stage as soon
    // as it exists and waits there for that micro-batch's backward, up to
    // one per later virtual stage.
    if (first && !last && spec.tiedEmbeddings && cfg.zeroStage >= 2 &&
        cfg.numMicroBatches > 1)
      tables += std::min<double>(double(cfg.numMicroBatches),
                                 double(cfg.pp * cfg.virtualStages - 1));
    // Otherwise the last stage's sum arrives once, beside this stage's.
    else if (first && !last && spec.tiedEmbeddings && cfg.numMicroBatches > 1)
      tables += 1;
    m.transient = std::max(m.transient, tables * table);
  }

  // Communication buffers.
  const int replicas = cfg.dp * cfg.cp; // ranks sharing the parameters
  int comms = (cfg.tp > 1) + (replicas > 1) + (cfg.pp > 1) + (cfg.cp > 1);
  m.commBuffers = comms * cal.ncclBufferBytes;
  if (cfg.cp > 1) // K/V chunk in flight + being received, fwd and bwd (dK/dV)
    m.commBuffers += 4 * 2 * s * b * h / t * pr.activationBytes;
  if (cfg.pp > 1) // one send and one receive activation buffer
    m.commBuffers += 2 * s * b * h / spDiv * pr.activationBytes;
  if (replicas > 1 && cfg.zeroStage < 3) // bucket being reduced + being filled
    m.commBuffers += gradBuckets(m.grads, cfg.zeroStage, replicas, pr,
                                 cal.gradBucketBytes);
  if (replicas > 1 && cfg.zeroStage == 3)
    m.commBuffers +=
        zeroThreeBuffers(layerParamsPerTpRank(spec, cfg.tp), m.grads, replicas,
                         pr, cal.gradBucketBytes);

  m.workspace =
      cal.runtimeReservedBytes +
      cal.fragmentationFraction * (m.activations + m.transient + m.commBuffers);
  return m;
}

Expected<MemoryBreakdown> transformerPeakMemory(const TransformerSpec &spec,
                                                const TrainingConfig &cfg,
                                                const Calibration &cal) {
  DLOPT_RETURN_IF_ERROR(checkConfig(spec, cfg));
  MemoryBreakdown best;
  for (int st = 0; st < cfg.pp; ++st) {
    auto m = transformerStageMemory(spec, cfg, st, cal);
    if (!m)
      return m.status();
    if (st == 0 || m->total() > best.total())
      best = *m;
  }
  return best;
}

std::string MemoryBreakdown::str() const {
  const double gib = 1024.0 * 1024.0 * 1024.0;
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "stage %d\n"
                "  params        %9.3f GiB\n"
                "  grads         %9.3f GiB\n"
                "  optimizer     %9.3f GiB\n"
                "  activations   %9.3f GiB\n"
                "  transient     %9.3f GiB\n"
                "  comm buffers  %9.3f GiB\n"
                "  workspace     %9.3f GiB\n"
                "  total         %9.3f GiB\n",
                stage, params / gib, grads / gib, optimizer / gib,
                activations / gib, transient / gib, commBuffers / gib,
                workspace / gib, total() / gib);
  return buf;
}

} // namespace dlopt::planner
