//===- MemoryModel.h - Per-device memory of a training step (upper bound) -===//
//
// Model states (parameters, gradients, optimizer state) divided by tensor,
// pipeline and ZeRO data parallelism (Rajbhandari et al. 2020), activations
// per layer as dlopt's autodiff keeps them times the micro-batches a pipeline
// schedule keeps in flight, plus communication buffers and workspace.
// Formulas: docs/cost-model.md, "Memory".
//
//===----------------------------------------------------------------------===//
#pragma once

#include "planner/Calibration.h"
#include "planner/CostModel.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dlopt::planner {

enum class Optimizer { SGD, Momentum, Adam };
const char *optimizerName(Optimizer o);

enum class PipelineSchedule { GPipe, OneFOneB, Interleaved1F1B, ZeroBubble };
const char *scheduleName(PipelineSchedule s);

/// Bytes per parameter of each model state.
struct PrecisionConfig {
  double paramBytes = 2;     ///< bf16/fp16 working weights
  /// Gradients as held until the optimizer step: fp32, as dlopt runs mixed
  /// precision (each gradient is cast to its fp32 parameter's type and
  /// accumulated there; Megatron-LM's default too: 18 bytes per parameter
  /// with Adam). 2 prices a framework that keeps bf16 gradients (16 bytes
  /// per parameter; dlopt-compile --grad-accumulation bf16, dry runs only).
  double gradBytes = 4;
  /// Bytes per element of the gradient collectives (data-parallel
  /// all-reduce or reduce-scatter, the tied embedding's sum, the sequence-
  /// parallel norm weights): the compute dtype the backward pass forms
  /// gradients in, before the cast to gradBytes.
  double gradReduceBytes = 2;
  bool masterWeights = true; ///< fp32 copy under mixed precision
  double masterBytes = 4;
  double optimizerStateBytes = 4; ///< per moment (fp32)
  double activationBytes = 2;     ///< kept activations (compute dtype)
  /// Kept activations that are GEMM inputs (norm outputs, the attention
  /// output, the MLP's last input): 1 under fp8 (Transformer Engine keeps
  /// the fp8 cast it fed the GEMM); 0 means activationBytes.
  double gemmInputBytes = 0;
  /// fp8: the scaling state, an amax history of this many fp32 values plus
  /// a scale and its inverse per scaled tensor (a GEMM's input, weight and
  /// output gradient); 0 without fp8.
  double fp8AmaxHistory = 0;
  /// Attention as unfused kernels (dlopt-compile --attention-kernel
  /// unfused, dry runs only): the scores Q K^T are materialized, a fused
  /// scale-mask-softmax and, when the model has dropout, a dropout of the
  /// probabilities run over them, and P V is a second batched GEMM, as in
  /// Megatron-LM before FlashAttention. false: dlopt's fused kernels, which
  /// keep no score matrix (docs/cost-model.md, "Unfused attention").
  bool unfusedAttention = false;
  /// RMS norms (eagerNorm) and rotary embeddings (eagerRope) as eager
  /// PyTorch runs them (dlopt-compile --eager-kernels norm,rope, dry runs
  /// only): one kernel per op of their Python code, in fp32 (torchtitan's
  /// RMSNorm and apply_rotary_emb without torch.compile), where dlopt runs
  /// one fused kernel each (docs/cost-model.md, "Eager norms and rotary
  /// embeddings").
  bool eagerNorm = false, eagerRope = false;
};

/// The --eager-kernels list of PrecisionConfig::eagerNorm and eagerRope:
/// "norm", "rope", "norm,rope", or "none".
std::string eagerKernelsName(bool norm, bool rope);
/// Parses a comma-separated list of norm and rope (each at most once), or
/// "none"; false for anything else.
bool parseEagerKernels(std::string_view s, bool &norm, bool &rope);

/// Bytes of model state on one device.
struct StateMemory {
  double params = 0;
  double grads = 0;
  double optimizer = 0; ///< moments + master weights
  double total() const { return params + grads + optimizer; }
};

/// Model states for `paramsOnDevice` parameters (already divided by tp and
/// pp) with ZeRO stage `zeroStage` over `dp` ranks:
///   stage >= 1 divides optimizer state, >= 2 gradients, 3 parameters by dp.
Expected<StateMemory> stateMemory(double paramsOnDevice, int dp, int zeroStage,
                                  Optimizer optimizer,
                                  const PrecisionConfig &precision = {});

/// Bytes the optimizer step moves per parameter of its shard, as dlopt's
/// fused update runs it: it reads the gradient (gradBytes), reads and
/// writes each moment (optimizerStateBytes; Adam 2, momentum 1, SGD 0),
/// and either reads and writes the fp32 master and writes the working
/// weight (masterWeights) or reads and writes the weight. Adam: 28 in f32
/// and with bf16 gradients under a master, 30 with fp32 gradients (dlopt's
/// default mixed precision); SGD in f32 12, momentum 20.
double optimizerStepBytesPerParam(Optimizer optimizer,
                                  const PrecisionConfig &precision);

/// A GPT-style decoder (Megatron-LM layout).
struct TransformerSpec {
  int64_t numLayers = 0;
  int64_t hidden = 0;    ///< h
  int64_t heads = 0;     ///< a
  /// Key/value heads (grouped-query attention); 0 means `heads`.
  int64_t kvHeads = 0;
  int64_t seqLen = 0;    ///< s
  int64_t vocab = 0;     ///< v
  int64_t ffnHidden = 0; ///< 0 means 4h
  bool tiedEmbeddings = true;
  bool learnedPositions = true;
  /// Norm weights and biases per layer and after the last layer (GPT: 2
  /// layer norms with both; Llama: 2 RMS norms with weights only).
  int64_t normParamsPerLayer = 4, normParamsPost = 2;

  /// The MLP width tensor parallelism splits, when it differs from the
  /// parameter-equivalent ffnHidden (a gated MLP with 3 matrices of width
  /// f counts as a GPT MLP of width about 1.5f); 0 means ffn().
  int64_t ffnShardWidth = 0;
  /// A gated MLP (SwiGLU: gate, up, their product): its backward keeps four
  /// [s, b, tpWidth] values per layer where a GELU MLP keeps two.
  bool gatedMlp = false;
  /// The model has dropout ops (dlopt-gen --dropout): unfused attention
  /// drops its probabilities too (Megatron-LM's attention_dropout).
  bool dropout = false;
  /// The layers' norms are RMS norms (dlopt.rms_norm), and q and k are
  /// rotated (dlopt.rope): what --eager-kernels can price as eager
  /// PyTorch's op sequences.
  bool rmsNorm = false, rope = false;

  int64_t ffn() const { return ffnHidden ? ffnHidden : 4 * hidden; }
  int64_t tpWidth() const { return ffnShardWidth ? ffnShardWidth : ffn(); }
  int64_t kv() const { return kvHeads > 0 ? kvHeads : heads; }
  /// One layer: QKV + projection + two MLP matrices, their biases, two
  /// layer norms: 4h^2 + 2hf + 9h + f (= 12h^2 + 13h when f = 4h).
  double layerParams() const;
  /// Word (v*h) plus learned position (s*h) embeddings.
  double embeddingParams() const;
  /// layers + embeddings + final layer norm (+ untied output matrix).
  double totalParams() const;
  Status validate() const;
};

/// The parallel configuration the memory depends on.
struct TrainingConfig {
  int dp = 1, tp = 1, pp = 1;
  /// Context parallelism: the sequence is split over cp ranks (ring
  /// attention); parameters are replicated over cp and their gradients and
  /// ZeRO shards span dp * cp ranks (Megatron-LM's layout).
  int cp = 1;
  int zeroStage = 0;
  int64_t microBatchSize = 1;  ///< b
  int64_t numMicroBatches = 1; ///< m, per pipeline per step
  PipelineSchedule schedule = PipelineSchedule::OneFOneB;
  int virtualStages = 1; ///< v, interleaved 1F1B only
  RecomputePolicy recompute = RecomputePolicy::None;
  bool sequenceParallel = false;
  Optimizer optimizer = Optimizer::Adam;
  PrecisionConfig precision;
  /// Layers per pipeline stage when the split is not the uniform one (a
  /// heterogeneous cluster gives faster stages more layers). Empty means
  /// uniform: the first L mod pp stages get one layer more. When set it has
  /// pp entries, each >= 1, summing to the model's layers.
  std::vector<int64_t> stageLayerCounts;
};

/// Activation bytes one layer keeps for one micro-batch: the forward values
/// dlopt's autodiff reads in the layer's backward pass, for the blocks
/// dlopt-gen writes (pre-norm, fused attention, GELU or gated MLP, no
/// dropout). With e = activationBytes, s' = s/cp the tokens of a rank,
/// t = tp, kv/a the key/value share of the heads, w the MLP width tp
/// splits and g = 4 for a gated MLP (2 otherwise):
///   none, selective:  e s'bh (R + (2 + 2 (kv/a) cp + g w/h) / t)
///     R = 4 without SP (the layer input, the residual after attention and
///     the two norm outputs, replicated over tp), 2 + 2/t with SP (the
///     norm outputs gathered over tp for the column-parallel matmuls, the
///     two residuals split), 4/t with SP and selective recomputation (the
///     norm outputs' shards: the backward pass gathers them again);
///     q and the attention output per rank, k and v gathered over cp;
///   full:             e s'bh (/t with SP), the layer input.
/// The fused attention keeps no score matrix: its backward recomputes the
/// probabilities from q and k. Selective recomputation re-runs softmax and
/// dropout results, which these blocks do not have, and under SP the tp
/// all-gathers of the norm outputs; without SP it keeps what none keeps. For GPT at t = cp = 1 this is 16 e sbh, Korthikanti et al.'s
/// 34 sbh less its two dropout masks and its 5as/h score term.
double activationBytesPerLayer(const TransformerSpec &spec,
                               const TrainingConfig &cfg);

/// Eager RMS norms (PrecisionConfig::eagerNorm): the bytes a layer keeps
/// beyond dlopt's fused kernels' under none and selective recomputation,
/// per micro-batch. Autograd keeps each of the two norms' x.float() (in
/// place of x, which the fused norm keeps: 4 - e more) and its normalized
/// value cast back (e): 8 s b h / (sp ? t : 1) at any e. 0 otherwise, and
/// for models without RMS norms; eager rotations keep nothing more (the
/// frequencies need no gradient, so autograd keeps neither input).
double eagerNormBytesKept(const TransformerSpec &spec,
                          const TrainingConfig &cfg);

/// Unfused attention (PrecisionConfig::unfusedAttention): the score
/// elements of one layer on one rank for one micro-batch, b (a/t) (s/cp) s
/// (the whole matrix: a causal mask is applied to it, not skipped); 0 with
/// fused attention.
double attentionScoreElements(const TransformerSpec &spec,
                              const TrainingConfig &cfg);
/// Bytes per score element one layer keeps for its backward under `cfg`'s
/// recomputation (Korthikanti et al.'s 5as/h term at e = 2 with dropout):
/// none keeps the probabilities (e) and, with dropout, the mask (1) and the
/// dropped probabilities (e); elementwise and alternate recomputation keep
/// the scores (e) and re-run softmax and dropout; selective and full keep
/// none. 0 with fused attention.
double attentionScoreBytesKept(const TransformerSpec &spec,
                               const TrainingConfig &cfg);

/// Micro-batches whose activations stage `stage` holds at its peak, in units
/// of that stage's full layer set: GPipe m; 1F1B min(pp - stage, m);
/// zero-bubble (ZB-H1) min(pp, m) on every stage (W is deferred); interleaved 1F1B (stage 0 worst) pp (1 + (pp-1)/(pp v))
/// capped at m.
double microBatchesInFlight(const TrainingConfig &cfg, int stage);

/// The gradient buckets of a data-parallel step below ZeRO-3: one being
/// reduced and one being filled, 2 x `bucketBytes`, but never more than
/// the stage's gradients in the collective's precision (a bucket holds
/// flattened gradients, so a stage whose gradients fit one bucket holds no
/// second). `grads` are the gradients as held (1/replicas of them under
/// ZeRO 2, whose reduce-scatters still take whole gradients).
double gradBuckets(double grads, int zeroStage, int replicas,
                   const PrecisionConfig &pr, double bucketBytes);

/// What ZeRO-3 holds beside the sharded model states: the gathered
/// parameters of the unit at work (`unitParams` elements: a layer, or an
/// op-level graph's largest parameter) and of the next one's gather (one
/// unit prefetched, as its overlap is priced), and in the backward the
/// gradients whole until their reduce-scatter: dlopt reduce-scatters them
/// in grad_bucket_mib buckets as under ZeRO 1-2, so one bucket being
/// filled and its concatenation being reduced, each at most the whole
/// gradient (`gradShard` x `replicas`) in the reduce dtype. dlopt's arena
/// peaks there under ZeRO-3 (a bucket's concatenation).
double zeroThreeBuffers(double unitParams, double gradShard, int replicas,
                        const PrecisionConfig &pr, double bucketBytes);

/// Layers assigned to pipeline stage `stage` (the first L mod pp stages get
/// one extra).
int64_t layersOnStage(const TransformerSpec &spec, int pp, int stage);
/// Interleaved 1F1B: the layers of each of the pp*v model chunks (chunk j
/// runs on stage j mod pp), the first L mod (pp*v) chunks one layer longer.
std::vector<int64_t> interleavedChunkLayers(int64_t layers, int pp, int v);
/// Layers on stage `stage` under `cfg`: cfg.stageLayerCounts when set, the
/// uniform split otherwise.
int64_t layersOnStage(const TransformerSpec &spec, const TrainingConfig &cfg,
                      int stage);

struct MemoryBreakdown {
  int stage = 0;
  double params = 0, grads = 0, optimizer = 0;
  double activations = 0; ///< stored across micro-batches in flight
  double transient = 0;   ///< working set of one layer's backward
  double commBuffers = 0; ///< NCCL, gradient buckets, p2p, ZeRO-3 gathers
  double workspace = 0;   ///< runtime reserve + fragmentation
  double total() const {
    return params + grads + optimizer + activations + transient + commBuffers +
           workspace;
  }
  /// Multi-line table in GiB.
  std::string str() const;
};

/// Upper bound of the memory of one device of pipeline stage `stage`.
/// Errors name the constraint that fails (heads % tp, layers < pp, ...).
Expected<MemoryBreakdown> transformerStageMemory(const TransformerSpec &spec,
                                                 const TrainingConfig &cfg,
                                                 int stage,
                                                 const Calibration &cal = {});
/// The same for a stage holding `layers` layers, whatever cfg's split says
/// (the heterogeneous partitioner probes stage sizes with it).
Expected<MemoryBreakdown>
transformerStageMemoryWithLayers(const TransformerSpec &spec,
                                 const TrainingConfig &cfg, int stage,
                                 int64_t layers, const Calibration &cal = {});
/// The stage with the largest total.
Expected<MemoryBreakdown> transformerPeakMemory(const TransformerSpec &spec,
                                                const TrainingConfig &cfg,
                                                const Calibration &cal = {});

} // namespace dlopt::planner
