//===- MemoryModelTest.cpp - Model states, activations, schedules ---------===//
#include "planner/MemoryModel.h"
#include "test/unit/planner/TestUtil.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace dlopt::planner;

namespace {

constexpr double kRel = 1e-12;

/// GPT-3 175B (Brown et al. 2020): 96 layers, h = 12288, 96 heads,
/// s = 2048, GPT-2 vocabulary of 50257.
TransformerSpec gpt3() {
  TransformerSpec s;
  s.numLayers = 96;
  s.hidden = 12288;
  s.heads = 96;
  s.seqLen = 2048;
  s.vocab = 50257;
  return s;
}

/// tp=8, pp=16, dp=8, ZeRO-1, Adam, bf16 + fp32 master weights.
TrainingConfig gpt3Config() {
  TrainingConfig c;
  c.dp = 8;
  c.tp = 8;
  c.pp = 16;
  c.zeroStage = 1;
  c.microBatchSize = 1;
  c.numMicroBatches = 64;
  c.schedule = PipelineSchedule::OneFOneB;
  c.recompute = RecomputePolicy::Selective;
  c.sequenceParallel = true;
  return c;
}

std::string errorOf(const Expected<MemoryBreakdown> &e) {
  return e ? std::string("<ok>") : e.status().message();
}

} // namespace

//===----------------------------------------------------------------------===//
// Model states
//===----------------------------------------------------------------------===//

TEST(StateMemory, Gpt3EvenSplitZeroStages) {
  // 175e9 params over tp*pp = 128 -> 1.3671875e9 params per device.
  // Mixed-precision Adam as dlopt runs it: 2 (bf16 params) + 4 (fp32
  // grads) + 12 (fp32 master + 2 moments) = 18 bytes per parameter.
  double phi = 175e9 / 128;
  auto z1 = stateMemory(phi, 8, 1, Optimizer::Adam);
  ASSERT_TRUE(z1);
  EXPECT_DOUBLE_EQ(z1->params, 2.734375e9);      // 2 * phi
  EXPECT_DOUBLE_EQ(z1->grads, 5.46875e9);        // 4 * phi
  EXPECT_DOUBLE_EQ(z1->optimizer, 2.05078125e9); // 12 * phi / 8
  auto z0 = stateMemory(phi, 8, 0, Optimizer::Adam);
  EXPECT_DOUBLE_EQ(z0->optimizer, 16.40625e9); // 12 * phi
  auto z2 = stateMemory(phi, 8, 2, Optimizer::Adam);
  EXPECT_DOUBLE_EQ(z2->grads, 0.68359375e9); // 4 * phi / 8
  EXPECT_DOUBLE_EQ(z2->params, 2.734375e9);
  auto z3 = stateMemory(phi, 8, 3, Optimizer::Adam);
  EXPECT_DOUBLE_EQ(z3->params, 0.341796875e9); // 2 * phi / 8
  EXPECT_DOUBLE_EQ(z3->total(), 18 * phi / 8);
  // 16-bit gradients (--grad-accumulation bf16): the ZeRO paper's 16 bytes
  // (2 + 2 + K, K = 12).
  PrecisionConfig bf16Grads;
  bf16Grads.gradBytes = 2;
  auto z3b = stateMemory(phi, 8, 3, Optimizer::Adam, bf16Grads);
  EXPECT_DOUBLE_EQ(z3b->total(), 16 * phi / 8);
}

TEST(StateMemory, OptimizersAndPrecision) {
  PrecisionConfig fp32;
  fp32.paramBytes = 4;
  fp32.gradBytes = 4;
  fp32.masterWeights = false;
  // fp32 Adam: 4 + 4 + 8 = 16 bytes per parameter.
  auto adam = stateMemory(1e9, 1, 0, Optimizer::Adam, fp32);
  EXPECT_DOUBLE_EQ(adam->total(), 16e9);
  // Plain SGD in fp32 keeps no optimizer state.
  EXPECT_DOUBLE_EQ(stateMemory(1e9, 1, 0, Optimizer::SGD, fp32)->optimizer, 0);
  // Momentum under mixed precision: 4 (momentum) + 4 (master) bytes.
  EXPECT_DOUBLE_EQ(stateMemory(1e9, 1, 0, Optimizer::Momentum)->optimizer, 8e9);
}

TEST(StateMemory, OptimizerStepBytesFollowThePrecision) {
  PrecisionConfig fp32;
  fp32.paramBytes = 4;
  fp32.gradBytes = 4;
  fp32.masterWeights = false;
  // f32 Adam: read the gradient (4), read and write m and v (16), read and
  // write the weight (8).
  EXPECT_DOUBLE_EQ(optimizerStepBytesPerParam(Optimizer::Adam, fp32), 28);
  EXPECT_DOUBLE_EQ(optimizerStepBytesPerParam(Optimizer::Momentum, fp32), 20);
  EXPECT_DOUBLE_EQ(optimizerStepBytesPerParam(Optimizer::SGD, fp32), 12);
  // bf16 with fp32 gradients and master (the default): gradient 4, moments
  // 16, master read and write 8, bf16 weight written 2.
  PrecisionConfig mixed;
  EXPECT_DOUBLE_EQ(optimizerStepBytesPerParam(Optimizer::Adam, mixed), 30);
  // bf16 gradients read 2.
  mixed.gradBytes = 2;
  EXPECT_DOUBLE_EQ(optimizerStepBytesPerParam(Optimizer::Adam, mixed), 28);
  // 16-bit moments (an 8-bit-optimizer-like state of 2 bytes each).
  mixed.optimizerStateBytes = 2;
  EXPECT_DOUBLE_EQ(optimizerStepBytesPerParam(Optimizer::Adam, mixed), 20);
}

TEST(StateMemory, Errors) {
  EXPECT_FALSE(stateMemory(1, 0, 0, Optimizer::Adam));
  auto z = stateMemory(1, 2, 4, Optimizer::Adam);
  ASSERT_FALSE(z);
  EXPECT_EQ(z.status().message(), "expected a ZeRO stage from 0 to 3, got 4");
  EXPECT_FALSE(stateMemory(-1, 1, 0, Optimizer::Adam));
}

//===----------------------------------------------------------------------===//
// Transformer parameters
//===----------------------------------------------------------------------===//

TEST(Transformer, Gpt3ParameterCount) {
  TransformerSpec s = gpt3();
  // 12h^2 + 13h = 12 * 150994944 + 13 * 12288 = 1812099072.
  EXPECT_DOUBLE_EQ(s.layerParams(), 1812099072.0);
  // 96 layers + 50257h + 2048h (positions) + 2h (final LN) = 174.6e9.
  EXPECT_DOUBLE_EQ(s.totalParams(), 174604259328.0);
}

TEST(Transformer, Gpt3StateBytesPerDeviceByHand) {
  // Per tp rank, one layer: (12h^2 + 7h)/8 + 6h (replicated biases + LNs)
  //   = 1812025344 / 8 + 73728 = 226576896.
  // Stage 0: 6 layers + word embedding + positions, both replicated (the
  // vocabulary, 50257, does not divide by tp = 8, so dlopt keeps the table
  // whole; Megatron pads it to a multiple of 128 tp instead)
  //   = 1359461376 + 617558016 + 25165824 = 2002185216 params.
  TransformerSpec s = gpt3();
  TrainingConfig c = gpt3Config();
  auto m0 = transformerStageMemory(s, c, 0);
  ASSERT_TRUE(m0) << errorOf(m0);
  EXPECT_DOUBLE_EQ(m0->params, 2 * 2002185216.0);
  EXPECT_DOUBLE_EQ(m0->grads, 4 * 2002185216.0); // fp32 gradients
  EXPECT_DOUBLE_EQ(m0->optimizer, 12 * 2002185216.0 / 8);
  // Middle stage: layers only. Last stage: + final LN (2h) + output matrix.
  auto mid = transformerStageMemory(s, c, 7);
  EXPECT_DOUBLE_EQ(mid->params, 2 * 1359461376.0);
  auto last = transformerStageMemory(s, c, 15);
  EXPECT_DOUBLE_EQ(last->params, 2 * (1359461376.0 + 24576 + 617558016));
  // A vocabulary that divides by tp is split: 50304 (Megatron's padding).
  s.vocab = 50304;
  auto padded = transformerStageMemory(s, c, 15);
  EXPECT_DOUBLE_EQ(padded->params, 2 * (1359461376.0 + 24576 + 50304.0 * 12288 / 8));
}

//===----------------------------------------------------------------------===//
// Activations: what dlopt's autodiff keeps per layer
//===----------------------------------------------------------------------===//

// Eager PyTorch's RMS norms keep x.float() in place of x and the
// normalized value cast back: 4 bytes an element a norm more than the
// fused kernel's at any activation width, 8 s b h a layer; under none and
// selective only, and only with norm among the eager kernels.
TEST(Activations, EagerNormsKeepTheirFp32Copies) {
  TransformerSpec s = gpt3();
  TrainingConfig c;
  const double sbh = 25165824; // 2048 x 12288
  const double fused = activationBytesPerLayer(s, c);
  c.precision.eagerNorm = true;
  // A model without RMS norms: nothing more.
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), fused);
  s.rmsNorm = true;
  s.rope = true;
  EXPECT_DOUBLE_EQ(eagerNormBytesKept(s, c), 8 * sbh);
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), fused + 8 * sbh);
  // fp32 activations: the same 4 bytes (the normalized value; x.float()
  // is x).
  c.precision.activationBytes = 4;
  EXPECT_DOUBLE_EQ(eagerNormBytesKept(s, c), 8 * sbh);
  c.precision.activationBytes = 2;
  // Eager rotations keep nothing more.
  c.precision.eagerNorm = false;
  c.precision.eagerRope = true;
  EXPECT_DOUBLE_EQ(eagerNormBytesKept(s, c), 0);
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), fused);
  c.precision.eagerNorm = true;
  // Sequence parallelism splits them over tp.
  c.tp = 8;
  c.sequenceParallel = true;
  EXPECT_DOUBLE_EQ(eagerNormBytesKept(s, c), 8 * sbh / 8);
  c.sequenceParallel = false;
  EXPECT_DOUBLE_EQ(eagerNormBytesKept(s, c), 8 * sbh);
  c.recompute = RecomputePolicy::Selective;
  EXPECT_DOUBLE_EQ(eagerNormBytesKept(s, c), 8 * sbh);
  // Recomputed norms keep nothing.
  for (RecomputePolicy r :
       {RecomputePolicy::Elementwise, RecomputePolicy::Alternate,
        RecomputePolicy::Full}) {
    c.recompute = r;
    EXPECT_DOUBLE_EQ(eagerNormBytesKept(s, c), 0);
  }
}

TEST(Activations, EagerKernelsList) {
  bool n = true, r = true;
  EXPECT_TRUE(parseEagerKernels("none", n, r));
  EXPECT_FALSE(n || r);
  EXPECT_TRUE(parseEagerKernels("rope,norm", n, r));
  EXPECT_TRUE(n && r);
  EXPECT_TRUE(parseEagerKernels("rope", n, r));
  EXPECT_TRUE(!n && r);
  for (const char *bad : {"", "norm,", ",rope", "norm,norm", "eager", "all",
                          "norm,rope,norm", "none,norm"})
    EXPECT_FALSE(parseEagerKernels(bad, n, r)) << bad;
  EXPECT_EQ(eagerKernelsName(true, true), "norm,rope");
  EXPECT_EQ(eagerKernelsName(false, true), "rope");
  EXPECT_EQ(eagerKernelsName(false, false), "none");
}

// Unfused attention (Megatron-LM before FlashAttention) keeps the
// probabilities, the dropout's mask and its output: Korthikanti et al.'s
// 5as/h term of 34 + 5as/h (bytes per sbh at 2-byte activations).
TEST(Activations, UnfusedAttentionKeepsTheScores) {
  TransformerSpec s = gpt3();
  s.dropout = true;
  TrainingConfig c;
  c.precision.unfusedAttention = true;
  const double sbh = 25165824;
  // a s / h = 96 x 2048 / 12288 = 16: 5 x 16 = 80 sbh more than fused.
  EXPECT_DOUBLE_EQ(attentionScoreElements(s, c), 96.0 * 2048 * 2048);
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), (32 + 80) * sbh);
  // tp = 8 splits the heads: 80 / 8.
  c.tp = 8;
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), (11 + 10) * sbh);
  // Without dropout only the probabilities (2 bytes): 32 / 8.
  s.dropout = false;
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), (11 + 4) * sbh);
  s.dropout = true;
  // Selective recomputation re-runs them (Korthikanti et al.): as fused.
  c.recompute = RecomputePolicy::Selective;
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), 11 * sbh);
  // Elementwise keeps the scores (a matmul's output), 2 bytes: 32 / 8.
  c.recompute = RecomputePolicy::Elementwise;
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), (6 + 4) * sbh);
  // Full keeps the layer input only; one layer's recomputed scores (5
  // bytes each) and their two gradients (2 + 2) are the transient.
  c.recompute = RecomputePolicy::Full;
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), 2 * sbh);
  c.numMicroBatches = 1;
  s.vocab = 8; // no embedding gradient above one layer's working set
  auto fused = transformerStageMemory(
      s,
      [&] {
        TrainingConfig f = c;
        f.precision.unfusedAttention = false;
        return f;
      }(),
      0);
  auto unfused = transformerStageMemory(s, c, 0);
  ASSERT_TRUE(fused && unfused);
  EXPECT_DOUBLE_EQ(unfused->activations, fused->activations);
  const double n = 96.0 / 8 * 2048 * 2048;
  EXPECT_DOUBLE_EQ(fused->transient, 11 * sbh);
  EXPECT_DOUBLE_EQ(unfused->transient, 11 * sbh + 9 * n);
}

TEST(Activations, WhatDloptKeepsPerLayer) {
  TransformerSpec s = gpt3();
  TrainingConfig c;
  // s*b*h = 2048 * 1 * 12288 = 25165824; 2-byte activations. Per layer:
  // R (input, residual, two norm outputs) + (q, out, k, v + 2 MLP values
  // of width 4h) / t, in units of sbh elements.
  const double sbh = 25165824;
  c.tp = 1; // 2 (4 + 4 + 8) = 32: no score matrix, no dropout masks
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), 32 * sbh);
  c.tp = 8; // 2 (4 + 12/8)
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), 11 * sbh);
  c.sequenceParallel = true; // 2 (2 + 2/8 + 12/8): norm outputs gathered
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), 7.5 * sbh);
  // Selective: the norm outputs' shards, gathered again in the backward
  // pass: 2 (2/8 + 2/8 + 12/8).
  c.recompute = RecomputePolicy::Selective;
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), 4 * sbh);
  // Elementwise: no norm output, the MLP's first matmul output only (the
  // GELU's input): 2 (2/8 + (1 + 1 + 2 + 4) / 8) = 2.5 sbh with SP.
  c.recompute = RecomputePolicy::Elementwise;
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), 2.5 * sbh);
  c.sequenceParallel = false; // 2 (2 + 8/8): the two residuals replicated
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), 6 * sbh);
  c.tp = 1; // 2 (2 + 1 + 3 + 4) = 20 against none's 32
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), 20 * sbh);
  // Alternate: elementwise less k (the second matmul) and the attention's
  // out projection (the fourth) unless tp reduces it; fc2 (the sixth)
  // keeps nothing anyway. 2 (1 + (q, v) 2 + fc1 4 + attention output 1).
  c.recompute = RecomputePolicy::Alternate;
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), 16 * sbh);
  c.tp = 8; // the reduced out projection stays: 2 (1 + 1 + (2 + 4 + 1)/8)
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), 5.75 * sbh);
  c.sequenceParallel = true; // 2 (1/8 + 1/8 + 7/8)
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), 2.25 * sbh);
  c.recompute = RecomputePolicy::Selective;
  c.sequenceParallel = false; // nothing to re-run without SP: as none
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), 11 * sbh);
  c.recompute = RecomputePolicy::Full; // the layer input: 2sbh
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), 2 * sbh);
  c.sequenceParallel = true;
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), 2 * sbh / 8);
  c.microBatchSize = 4; // linear in b
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), 4 * 2 * sbh / 8);
  c.precision.activationBytes = 4; // and in the activation width
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), 4 * 4 * sbh / 8);
}

TEST(Activations, Fp8KeepsItsGemmInputsInOneByte) {
  TransformerSpec s = gpt3();
  TrainingConfig c;
  c.tp = 8;
  c.precision.gemmInputBytes = 1;
  const double sbh = 25165824;
  // GEMM inputs (two norm outputs, the attention output, the MLP's last
  // input: 2 + 1/8 + 4/8 = 2.625) at 1 byte, the rest (layer input,
  // residual, q, k, v, the MLP's first output: 2 + 3/8 + 4/8 = 2.875) at 2.
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), sbh * (2.625 + 2 * 2.875));
  // Together they are the bf16 formula's 11 sbh at 2 bytes.
  c.precision.gemmInputBytes = 2;
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), 11 * sbh);
  // The scaling state: 6 GEMMs x 3 tensors x (1024 + 2) fp32 per layer.
  TrainingConfig f = gpt3Config();
  PrecisionConfig fp8;
  fp8.paramBytes = 3;
  fp8.gemmInputBytes = 1;
  fp8.fp8AmaxHistory = 1024;
  TrainingConfig g = f;
  g.precision = fp8;
  auto a = transformerStageMemory(s, f, 7), b = transformerStageMemory(s, g, 7);
  ASSERT_TRUE(a && b);
  EXPECT_DOUBLE_EQ(b->params - 1.5 * a->params, 6 * 6 * 3 * 1026 * 4.0);
  // A gated MLP has three GEMMs (gate, up, down): 7 a layer.
  s.gatedMlp = true;
  auto ga = transformerStageMemory(s, f, 7),
       gb = transformerStageMemory(s, g, 7);
  ASSERT_TRUE(ga && gb);
  EXPECT_DOUBLE_EQ(gb->params - 1.5 * ga->params, 6 * 7 * 3 * 1026 * 4.0);
}

TEST(Activations, GroupedKvHeadsGatedMlpAndContextParallelism) {
  // Llama 3 8B: h 4096, 32 heads, 8 kv heads, a gated MLP of width 14336.
  TransformerSpec s;
  s.numLayers = 32;
  s.hidden = 4096;
  s.heads = 32;
  s.kvHeads = 8;
  s.seqLen = 8192;
  s.vocab = 128256;
  s.ffnHidden = 21504; // the parameter-equivalent GPT width, 1.5 x 14336
  s.ffnShardWidth = 14336;
  s.gatedMlp = true;
  s.tiedEmbeddings = false;
  s.learnedPositions = false;
  TrainingConfig c;
  const double sbh = 8192.0 * 4096;
  // 2 (4 + 2 + 2 x 8/32 + 4 x 14336/4096) = 2 (4 + 2.5 + 14) = 41.
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), 41 * sbh);
  // cp = 2: half the tokens, k and v gathered over cp (2 x 8/32 x 2):
  // 2 (4 + 3 + 14) = 42 per local sbh.
  c.cp = 2;
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), 42 * sbh / 2);
  // tp = 4 with SP: 2 (2 + 2/4 + (3 + 14)/4) = 2 x 6.75 per local sbh.
  c.tp = 4;
  c.sequenceParallel = true;
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), 13.5 * sbh / 2);
  // Alternate keeps the layer input, the reduced out projection, q, v, the
  // attention output and gate (k and up re-run): 2 (1/4 + 1/4 + (1 +
  // 8/32)/4 + 1/4 + 3.5/4) = 2 x 1.9375 per local sbh.
  c.recompute = RecomputePolicy::Alternate;
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), 3.875 * sbh / 2);
  c.tp = 1; // and the out projection re-runs: 2 (1 + 1.25 + 1 + 3.5)
  c.sequenceParallel = false;
  EXPECT_DOUBLE_EQ(activationBytesPerLayer(s, c), 13.5 * sbh / 2);
}

TEST(Activations, MicroBatchesInFlight) {
  TrainingConfig c;
  c.pp = 16;
  c.numMicroBatches = 64;
  c.schedule = PipelineSchedule::GPipe;
  EXPECT_DOUBLE_EQ(microBatchesInFlight(c, 0), 64);
  EXPECT_DOUBLE_EQ(microBatchesInFlight(c, 15), 64);
  c.schedule = PipelineSchedule::OneFOneB;
  EXPECT_DOUBLE_EQ(microBatchesInFlight(c, 0), 16); // first stage holds pp
  EXPECT_DOUBLE_EQ(microBatchesInFlight(c, 15), 1);
  c.schedule = PipelineSchedule::ZeroBubble; // W deferred: pp on every stage
  EXPECT_DOUBLE_EQ(microBatchesInFlight(c, 3), 16);
  c.schedule = PipelineSchedule::Interleaved1F1B;
  c.virtualStages = 2; // 16 * (1 + 15/32) = 23.5
  EXPECT_DOUBLE_EQ(microBatchesInFlight(c, 0), 23.5);
  c.numMicroBatches = 4; // never more than m
  c.schedule = PipelineSchedule::OneFOneB;
  EXPECT_DOUBLE_EQ(microBatchesInFlight(c, 0), 4);
}

TEST(Activations, Gpt3FirstStageBreakdownByHand) {
  TransformerSpec s = gpt3();
  TrainingConfig c = gpt3Config();
  Calibration cal;
  auto m = transformerStageMemory(s, c, 0, cal);
  ASSERT_TRUE(m) << errorOf(m);
  // Selective + SP: 4 sbh = 100663296 per layer (the norm outputs kept as
  // shards); 16 micro-batches in flight x 6 layers.
  EXPECT_DOUBLE_EQ(m->activations, 16 * 6 * 100663296.0);
  // The two norm outputs gathered again during a layer's backward pass,
  // 2 x 2sbh, are less than the embedding table's gradient, formed
  // whole beside the reduced one at the end of the backward pass, beside
  // the sum of the earlier micro-batches', and (the table is tied to the
  // last stage) beside the last stage's sum when it arrives
  // (3 x 50257 x 12288 x 4 B, fp32 gradients).
  EXPECT_DOUBLE_EQ(m->transient, 3 * 2 * 1235116032.0);
  // 3 communicators x 64 MiB + p2p 2 x sbh/t x 2 B + 2 x 25 MiB buckets.
  double comm = 3 * 64.0 * (1 << 20) + 2 * 3145728.0 * 2 + 2 * 25.0 * (1 << 20);
  EXPECT_DOUBLE_EQ(m->commBuffers, comm);
  EXPECT_REL(m->workspace,
             (1u << 30) + 0.05 * (m->activations + m->transient + comm), kRel);
  // Under an 80 GB H100/A100 (state 8.04 GB + activations 10.3 GB + ...).
  EXPECT_LT(m->total(), 80e9);
  EXPECT_NE(m->str().find("total"), std::string::npos);
  // Stage 0 is the peak under 1F1B.
  auto peak = transformerPeakMemory(s, c, cal);
  ASSERT_TRUE(peak);
  EXPECT_EQ(peak->stage, 0);
  EXPECT_DOUBLE_EQ(peak->total(), m->total());
}

TEST(Activations, LastStageHoldsLogits) {
  TransformerSpec s = gpt3();
  TrainingConfig c = gpt3Config();
  auto m = transformerStageMemory(s, c, 15);
  ASSERT_TRUE(m);
  // 1 micro-batch x 6 layers x 100663296, the final norm's input (split
  // by SP) and output (gathered), 2 sbh (1/8 + 1), and the logits and
  // their gradient, 2 x 2sbv (not split: 50257 does not divide by tp)
  //   = 603979776 + 56623104 + 4*2048*50257 (= 411705344).
  EXPECT_DOUBLE_EQ(m->activations, 603979776.0 + 56623104.0 + 411705344.0);
}

TEST(Activations, ScheduleAndRecomputeOrdering) {
  TransformerSpec s = gpt3();
  TrainingConfig c = gpt3Config();
  auto act = [&](TrainingConfig cfg) {
    return transformerStageMemory(s, cfg, 0)->activations;
  };
  TrainingConfig gpipe = c, full = c, none = c;
  gpipe.schedule = PipelineSchedule::GPipe;
  full.recompute = RecomputePolicy::Full;
  none.recompute = RecomputePolicy::None;
  EXPECT_GT(act(gpipe), act(c));
  EXPECT_LT(act(full), act(c));
  // Under SP, selective recomputation keeps the norm outputs' shards;
  // without SP it has nothing to re-run in these blocks.
  EXPECT_LT(act(c), act(none));
  TrainingConfig noSp = c, noSpNone = none;
  noSp.sequenceParallel = noSpNone.sequenceParallel = false;
  EXPECT_EQ(act(noSp), act(noSpNone));
}

//===----------------------------------------------------------------------===//
// Invariants and errors
//===----------------------------------------------------------------------===//

TEST(MemoryInvariants, MoreTpNeverMoreParamsPerDevice) {
  TransformerSpec s = gpt3();
  for (int pp : {1, 4, 16})
    for (int stage : {0, pp - 1}) {
      double prev = INFINITY;
      for (int tp : {1, 2, 4, 8, 16, 32}) {
        TrainingConfig c = gpt3Config();
        c.tp = tp;
        c.pp = pp;
        auto m = transformerStageMemory(s, c, stage);
        ASSERT_TRUE(m) << errorOf(m);
        EXPECT_LE(m->params, prev) << "tp=" << tp << " pp=" << pp;
        prev = m->params;
      }
    }
}

TEST(MemoryInvariants, MorePpOrDpWithZeroNeverMoreState) {
  TransformerSpec s = gpt3();
  double prev = INFINITY;
  for (int pp : {1, 2, 4, 8, 16, 32}) {
    TrainingConfig c = gpt3Config();
    c.pp = pp;
    auto m = transformerPeakMemory(s, c);
    ASSERT_TRUE(m);
    double state = m->params + m->grads + m->optimizer;
    EXPECT_LE(state, prev);
    prev = state;
  }
  for (int zero = 0; zero <= 3; ++zero) {
    double prevDp = INFINITY;
    for (int dp : {1, 2, 4, 8, 64}) {
      TrainingConfig c = gpt3Config();
      c.dp = dp;
      c.zeroStage = zero;
      auto m = transformerStageMemory(s, c, 1);
      double state = m->params + m->grads + m->optimizer;
      EXPECT_LE(state, prevDp) << "zero=" << zero << " dp=" << dp;
      prevDp = state;
    }
  }
}

TEST(MemoryErrors, ConstraintsNamed) {
  TransformerSpec s = gpt3();
  TrainingConfig c = gpt3Config();
  c.tp = 5;
  EXPECT_EQ(errorOf(transformerStageMemory(s, c, 0)),
            "tp=5 does not divide the 96 attention heads");
  c = gpt3Config();
  c.pp = 128;
  EXPECT_EQ(errorOf(transformerStageMemory(s, c, 0)),
            "pp=128 needs at least 128 layers, got 96");
  c = gpt3Config();
  c.schedule = PipelineSchedule::Interleaved1F1B;
  c.virtualStages = 8; // 16 * 8 = 128 chunks for 96 layers
  EXPECT_EQ(errorOf(transformerStageMemory(s, c, 0)),
            "interleaved 1F1B: pp=16 x v=8 model chunks need at least 128 "
            "layers, got 96");
  c = gpt3Config();
  EXPECT_EQ(errorOf(transformerStageMemory(s, c, 16)),
            "stage 16 is out of range for pp=16");
  c.zeroStage = -1;
  EXPECT_EQ(errorOf(transformerPeakMemory(s, c)),
            "expected a ZeRO stage from 0 to 3, got -1");
  c = gpt3Config();
  c.numMicroBatches = 0;
  EXPECT_EQ(errorOf(transformerPeakMemory(s, c)),
            "expected the number of micro-batches >= 1, got 0");
  TransformerSpec bad = s;
  bad.heads = 7;
  EXPECT_EQ(errorOf(transformerPeakMemory(bad, gpt3Config())),
            "transformer: hidden 12288 is not divisible by the 7 heads");
  bad = s;
  bad.vocab = 0;
  EXPECT_EQ(errorOf(transformerPeakMemory(bad, gpt3Config())),
            "transformer: expected vocab > 0, got 0");
}

TEST(MemoryModel, NonUniformStageSplit) {
  TransformerSpec s = gpt3(); // 96 layers, pp = 16 in gpt3Config
  TrainingConfig c = gpt3Config();
  c.stageLayerCounts.assign(16, 6);
  c.stageLayerCounts[0] = 3;
  c.stageLayerCounts[15] = 9;
  EXPECT_EQ(layersOnStage(s, c, 0), 3);
  EXPECT_EQ(layersOnStage(s, c, 15), 9);
  EXPECT_EQ(layersOnStage(s, c, 7), 6);
  // A middle stage holds the uniform split's memory; the first stage's
  // layer-proportional parts shrink with its layers.
  TrainingConfig u = gpt3Config();
  auto mid = transformerStageMemory(s, c, 7), midU = transformerStageMemory(s, u, 7);
  ASSERT_TRUE(mid && midU);
  EXPECT_DOUBLE_EQ(mid->total(), midU->total());
  auto first = transformerStageMemory(s, c, 0), firstU = transformerStageMemory(s, u, 0);
  ASSERT_TRUE(first && firstU);
  EXPECT_LT(first->params, firstU->params);
  // Explicit layers give the same as the split.
  auto probe = transformerStageMemoryWithLayers(s, u, 0, 3);
  ASSERT_TRUE(probe);
  EXPECT_DOUBLE_EQ(probe->total(), first->total());
  // Memory is affine in the stage's layers (the partitioner relies on it).
  auto m1 = transformerStageMemoryWithLayers(s, u, 3, 1);
  auto m2 = transformerStageMemoryWithLayers(s, u, 3, 2);
  auto m7 = transformerStageMemoryWithLayers(s, u, 3, 7);
  ASSERT_TRUE(m1 && m2 && m7);
  EXPECT_NEAR(m7->total(), m1->total() + 6 * (m2->total() - m1->total()),
              1e-6 * m7->total());
  EXPECT_EQ(errorOf(transformerStageMemoryWithLayers(s, u, 3, 0)),
            "a pipeline stage needs at least 1 layer, got 0");
}

TEST(MemoryErrors, BadStageSplitsNamed) {
  TransformerSpec s = gpt3();
  TrainingConfig c = gpt3Config();
  c.stageLayerCounts.assign(15, 6);
  EXPECT_EQ(errorOf(transformerStageMemory(s, c, 0)),
            "the stage split has 15 entries, expected pp=16");
  c.stageLayerCounts.assign(16, 6);
  c.stageLayerCounts[3] = 0;
  c.stageLayerCounts[4] = 12;
  EXPECT_EQ(errorOf(transformerStageMemory(s, c, 0)),
            "the stage split gives stage 3 0 layers, expected at least 1");
  c.stageLayerCounts.assign(16, 5);
  EXPECT_EQ(errorOf(transformerStageMemory(s, c, 0)),
            "the stage split covers 80 layers, expected 96");
}

TEST(MemoryModel, InterleavedChunks) {
  // 126 layers on 16 stages x 2 chunks: 30 chunks of 4, 2 of 3.
  auto n = interleavedChunkLayers(126, 16, 2);
  ASSERT_EQ(n.size(), 32u);
  EXPECT_EQ(n[0], 4);
  EXPECT_EQ(n[29], 4);
  EXPECT_EQ(n[30], 3);
  EXPECT_EQ(n[31], 3);
  int64_t sum = 0;
  for (int64_t x : n)
    sum += x;
  EXPECT_EQ(sum, 126);
  EXPECT_EQ(interleavedChunkLayers(96, 16, 2), std::vector<int64_t>(32, 3));
}

TEST(MemoryModel, GradientBucketsNeverHoldMoreThanTheGradients) {
  const double MiB = 1024.0 * 1024.0, bucket = 25 * MiB;
  PrecisionConfig f32; // f32 gradients, reduced in f32
  f32.gradBytes = 4;
  f32.gradReduceBytes = 4;
  // Large gradients: one bucket being reduced, one being filled.
  EXPECT_DOUBLE_EQ(gradBuckets(400 * MiB, 0, 8, f32, bucket), 2 * bucket);
  // A stage whose 20 MiB of gradients fit one bucket holds just them.
  EXPECT_DOUBLE_EQ(gradBuckets(20 * MiB, 0, 2, f32, bucket), 20 * MiB);
  EXPECT_DOUBLE_EQ(gradBuckets(30 * MiB, 1, 2, f32, bucket), 30 * MiB);
  // ZeRO 2 holds 1/R of them, but reduce-scatters whole ones.
  EXPECT_DOUBLE_EQ(gradBuckets(10 * MiB, 2, 4, f32, bucket), 40 * MiB);
  // Mixed precision: held in fp32, reduced in bf16.
  PrecisionConfig bf16;
  bf16.gradBytes = 4;
  bf16.gradReduceBytes = 2;
  EXPECT_DOUBLE_EQ(gradBuckets(40 * MiB, 0, 2, bf16, bucket), 20 * MiB);
  EXPECT_DOUBLE_EQ(gradBuckets(4000 * MiB, 0, 2, bf16, bucket), 2 * bucket);
}

TEST(MemoryModel, ZeroThreeHoldsTwoLayersAndAGradientBucketTwice) {
  const double MiB = 1024.0 * 1024.0, bucket = 25 * MiB;
  PrecisionConfig f32;
  f32.paramBytes = 4;
  f32.gradBytes = 4;
  f32.gradReduceBytes = 4;
  // The layer at work and the next gather (1M parameters each, f32), and
  // a bucket's gradients with their concatenation: 100 MiB of gradients
  // over 4 ranks hold 25 MiB shards, reduce-scattered in 25 MiB buckets.
  EXPECT_DOUBLE_EQ(zeroThreeBuffers(1 << 20, 25 * MiB, 4, f32, bucket),
                   2 * 4 * MiB + 2 * bucket);
  // Gradients that fit one bucket: the whole gradient and its
  // concatenation (12 MiB over 4 ranks, 3 MiB shards).
  EXPECT_DOUBLE_EQ(zeroThreeBuffers(1 << 20, 3 * MiB, 4, f32, bucket),
                   2 * 4 * MiB + 2 * 12 * MiB);
  // Gradients held in fp32 and reduced in bf16: 20 MiB shards over 2 ranks
  // are 40 MiB of fp32 gradients, 20 MiB reduced, within one bucket.
  PrecisionConfig mixed = f32;
  mixed.paramBytes = 2;
  mixed.gradReduceBytes = 2;
  EXPECT_DOUBLE_EQ(zeroThreeBuffers(1 << 20, 20 * MiB, 2, mixed, bucket),
                   2 * 2 * MiB + 2 * 20 * MiB);
  // No buckets (grad_bucket_mib 0): one gradient whole and its copy.
  EXPECT_DOUBLE_EQ(zeroThreeBuffers(0, 5 * MiB, 2, f32, 0), 2 * 10 * MiB);

  // A whole stage: GPT-3 175B's first stage at dp=8 ZeRO-3 holds the
  // two layers per tp rank and two 25 MiB buckets beside its
  // communicators' buffers (its gradients are far more than a bucket).
  TransformerSpec s = gpt3();
  TrainingConfig c = gpt3Config();
  c.zeroStage = 3;
  Calibration cal;
  auto m = transformerStageMemory(s, c, 0, cal);
  ASSERT_TRUE(m) << errorOf(m);
  // A layer per tp rank: its split matrices and biases, and the norms'
  // and the row-parallel biases' 6h replicated.
  const double h = s.hidden, f = s.ffn();
  const double layer = ((4 * h * h + 2 * h * f + 3 * h + f) / c.tp + 6 * h) *
                       c.precision.paramBytes;
  const double comm = 3 * 64.0 * MiB + 2 * 3145728.0 * 2;
  EXPECT_REL(m->commBuffers, comm + 2 * layer + 2 * bucket, kRel);
}
