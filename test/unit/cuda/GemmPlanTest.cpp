//===- GemmPlanTest.cpp - matmul -> cuBLASLt call planning, on the CPU ----===//
//
// planMatmul's calls are checked by replaying them on the host with a naive
// GEMM and comparing with a direct NumPy-style batched matmul.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/CudaGemm.h"

#include <gtest/gtest.h>

#include <random>

using namespace dlopt::rt;
using namespace dlopt::rt::cuda;

namespace {

TensorType f32(std::vector<int64_t> s) { return TensorType{DType::F32, s}; }

/// Row-major reference: batch dims broadcast, optional transposes.
std::vector<float> reference(const TensorType &ta, const std::vector<float> &a,
                             const TensorType &tb, const std::vector<float> &b,
                             const TensorType &tc, bool transA, bool transB) {
  size_t ra = ta.shape.size(), rb = tb.shape.size(), rc = tc.shape.size();
  int64_t m = tc.shape[rc - 2], n = tc.shape[rc - 1];
  int64_t k = transA ? ta.shape[ra - 2] : ta.shape[ra - 1];
  std::vector<int64_t> batch(tc.shape.begin(), tc.shape.end() - 2);
  int64_t nb = 1;
  for (int64_t d : batch)
    nb *= d;
  std::vector<float> c(size_t(nb * m * n), 0.0f);
  auto offset = [&](const TensorType &t, int64_t bi) {
    // Matrix index of batch bi in t (broadcast dims repeat).
    std::vector<int64_t> tb(t.shape.begin(), t.shape.end() - 2);
    int64_t off = 0, stride = 1, rem = bi;
    std::vector<int64_t> idx(batch.size());
    for (size_t d = batch.size(); d-- > 0;) {
      idx[d] = rem % batch[d];
      rem /= batch[d];
    }
    for (size_t j = tb.size(); j-- > 0;) {
      size_t d = batch.size() - tb.size() + j;
      off += (tb[j] == 1 ? 0 : idx[d]) * stride;
      stride *= tb[j];
    }
    return off;
  };
  for (int64_t bi = 0; bi < nb; ++bi) {
    const float *pa = a.data() + offset(ta, bi) * m * k;
    const float *pb = b.data() + offset(tb, bi) * k * n;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        float s = 0;
        for (int64_t p = 0; p < k; ++p)
          s += (transA ? pa[p * m + i] : pa[i * k + p]) *
               (transB ? pb[j * k + p] : pb[p * n + j]);
        c[(bi * m + i) * n + j] = s;
      }
  }
  (void)rb;
  return c;
}

/// Replays a plan as cuBLASLt would compute it (column-major C^T = B^T A^T
/// is the same as row-major C = A B, so replay row-major per call).
std::vector<float> replay(const GemmPlan &p, const std::vector<float> &a,
                          const std::vector<float> &b, size_t cSize) {
  std::vector<float> c(cSize, -1.0f);
  for (int64_t call = 0; call < p.calls(); ++call)
    for (int64_t bi = 0; bi < p.batchCount; ++bi) {
      const float *pa = a.data() + p.aOffsets[call] + bi * p.strideA;
      const float *pb = b.data() + p.bOffsets[call] + bi * p.strideB;
      float *pc = c.data() + p.cOffsets[call] + bi * p.strideC;
      for (int64_t i = 0; i < p.m; ++i)
        for (int64_t j = 0; j < p.n; ++j) {
          float s = 0;
          for (int64_t q = 0; q < p.k; ++q)
            s += (p.transA ? pa[q * p.lda() + i] : pa[i * p.lda() + q]) *
                 (p.transB ? pb[j * p.ldb() + q] : pb[q * p.ldb() + j]);
          pc[i * p.ldc() + j] = s;
        }
    }
  return c;
}

void check(TensorType ta, TensorType tb, TensorType tc, bool transA,
           bool transB, int64_t expectCalls, int64_t expectBatch) {
  auto plan = planMatmul(ta, tb, tc, transA, transB);
  ASSERT_TRUE(plan) << plan.status().message();
  EXPECT_EQ(plan->calls(), expectCalls) << tc.str();
  EXPECT_EQ(plan->batchCount, expectBatch) << tc.str();
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> a(size_t(ta.numElements())), b(size_t(tb.numElements()));
  for (float &x : a)
    x = u(rng);
  for (float &x : b)
    x = u(rng);
  std::vector<float> want = reference(ta, a, tb, b, tc, transA, transB);
  std::vector<float> got = replay(*plan, a, b, want.size());
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-4) << "element " << i << " of " << tc.str();
}

TEST(GemmPlan, PlainMatrix) { check(f32({3, 5}), f32({5, 4}), f32({3, 4}), false, false, 1, 1); }

TEST(GemmPlan, Transposes) {
  check(f32({5, 3}), f32({5, 4}), f32({3, 4}), true, false, 1, 1);
  check(f32({3, 5}), f32({4, 5}), f32({3, 4}), false, true, 1, 1);
  check(f32({5, 3}), f32({4, 5}), f32({3, 4}), true, true, 1, 1);
}

TEST(GemmPlan, LinearLayerFoldsIntoOneTallGemm) {
  auto p = planMatmul(f32({2, 6, 5}), f32({5, 4}), f32({2, 6, 4}), false, false);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->m, 12);
  check(f32({2, 6, 5}), f32({5, 4}), f32({2, 6, 4}), false, false, 1, 1);
  check(f32({2, 3, 6, 5}), f32({4, 5}), f32({2, 3, 6, 4}), false, true, 1, 1);
}

TEST(GemmPlan, SameBatchIsOneStridedCall) {
  check(f32({4, 3, 5}), f32({4, 5, 2}), f32({4, 3, 2}), false, false, 1, 4);
  check(f32({2, 3, 5, 4}), f32({2, 3, 5, 2}), f32({2, 3, 4, 2}), true, false, 1, 6);
}

TEST(GemmPlan, BroadcastOperandHasStrideZero) {
  // a has no batch, b has: stride 0 for a.
  auto p = planMatmul(f32({3, 5}), f32({4, 5, 2}), f32({4, 3, 2}), false, false);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->strideA, 0);
  check(f32({3, 5}), f32({4, 5, 2}), f32({4, 3, 2}), false, false, 1, 4);
  // Transposed a with a batch against a single b: no fold, stride 0 for b.
  check(f32({4, 5, 3}), f32({5, 2}), f32({4, 3, 2}), true, false, 1, 4);
}

TEST(GemmPlan, MixedBroadcastLoopsOverOuterDims) {
  // [2,1] x [1,3] batch: the inner dim is strided, the outer one a loop.
  check(f32({2, 1, 3, 5}), f32({1, 3, 5, 2}), f32({2, 3, 3, 2}), false, false,
        2, 3);
  check(f32({2, 3, 1, 3, 5}), f32({3, 4, 5, 2}), f32({2, 3, 4, 3, 2}), false,
        false, 6, 4);
}

TEST(GemmPlan, SizeOneBatchDimsAreDropped) {
  check(f32({1, 4, 1, 3, 5}), f32({4, 1, 5, 2}), f32({1, 4, 1, 3, 2}), false,
        false, 1, 4);
}

TensorType bf16(std::vector<int64_t> shape) {
  return TensorType{DType::BF16, std::move(shape)};
}

/// Replays padSteps on the host: the copies as cudaMemcpy2DAsync does
/// them, each chunk's GEMM as replay() does; the result must equal the
/// unpadded product.
void checkPadded(TensorType ta, TensorType tb, TensorType tc, bool transA,
                 bool transB, int64_t maxScratch, bool wantA, bool wantC,
                 int64_t wantChunks) {
  auto plan = planMatmul(ta, tb, tc, transA, transB);
  ASSERT_TRUE(plan) << plan.status().message();
  auto pad = planPadding(*plan, maxScratch, 0.0);
  ASSERT_TRUE(pad) << tc.str();
  EXPECT_EQ(pad->padA, wantA);
  EXPECT_EQ(pad->padC, wantC);
  EXPECT_LE(pad->scratchBytes, maxScratch);
  std::vector<PadStep> steps = padSteps(*plan, *pad);
  EXPECT_EQ(int64_t(steps.size()), wantChunks) << tc.str();
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> a(size_t(ta.numElements())), b(size_t(tb.numElements()));
  for (float &x : a)
    x = u(rng);
  for (float &x : b)
    x = u(rng);
  std::vector<float> want = reference(ta, a, tb, b, tc, transA, transB);
  std::vector<float> c(want.size(), -1.0f);
  std::vector<float> scratch(size_t(pad->scratchBytes / 2), -7.0f);
  auto copy = [](float *dst, const float *src, const PadCopy &p) {
    for (int64_t r = 0; r < p.height; ++r)
      for (int64_t x = 0; x < p.width; ++x)
        dst[p.dstOffset + r * p.dstPitch + x] =
            src[p.srcOffset + r * p.srcPitch + x];
  };
  for (const PadStep &st : steps) {
    // Aligned leading dims wherever a copy made them.
    if (st.aInScratch) {
      EXPECT_EQ(st.gemm.lda() % 8, 0);
    }
    if (st.cInScratch) {
      EXPECT_EQ(st.gemm.ldc() % 8, 0);
    }
    if (st.copyA) {
      ASSERT_LE(st.copyA->dstOffset + (st.copyA->height - 1) * st.copyA->dstPitch +
                    st.copyA->width,
                int64_t(scratch.size()));
      copy(scratch.data(), a.data(), *st.copyA);
    }
    const std::vector<float> &ga = st.aInScratch ? scratch : a;
    std::vector<float> &gc = st.cInScratch ? scratch : c;
    std::vector<float> part = replay(st.gemm, ga, b, gc.size());
    // replay() fills untouched elements with -1: keep only the chunk's.
    for (int64_t i = 0; i < st.gemm.m; ++i)
      for (int64_t j = 0; j < st.gemm.n; ++j) {
        size_t at = size_t(st.gemm.cOffsets[0] + i * st.gemm.ldc() + j);
        gc[at] = part[at];
      }
    if (st.copyC)
      copy(c.data(), scratch.data(), *st.copyC);
  }
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(c[i], want[i], 1e-4) << "element " << i << " of " << tc.str();
}

TEST(GemmPadding, UnalignedLeadingDimsRunThroughPaddedCopies) {
  // An LM head's three GEMMs with a vocabulary of 203 (not a multiple of
  // 8), in chunks of 64 rows of C: logits = x w^T (C unaligned), dx = dl w
  // (A unaligned), dw = dl^T x (A transposed and unaligned).
  const int64_t kib = 1024;
  checkPadded(bf16({200, 24}), bf16({203, 24}), bf16({200, 203}), false, true,
              64 * 208 * 2 + 256, false, true, 4);
  checkPadded(bf16({200, 203}), bf16({203, 24}), bf16({200, 24}), false, false,
              64 * 208 * 2 + 256, true, false, 4);
  checkPadded(bf16({200, 203}), bf16({200, 24}), bf16({203, 24}), true, false,
              64 * 200 * 2 + 7 * 200 * 2 + 256, true, false, 4);
  // Both A and C unaligned; everything in one chunk.
  checkPadded(bf16({48, 70}), bf16({203, 48}), bf16({70, 203}), true, true,
              64 * kib, true, true, 1);
  // A batch folded into one tall GEMM (a linear layer).
  checkPadded(bf16({2, 100, 24}), bf16({203, 24}), bf16({2, 100, 203}), false,
              true, 64 * 208 * 2 + 256, false, true, 4);
}

TEST(GemmPadding, OnlyWhereItPays) {
  auto plan = [](TensorType a, TensorType b, TensorType c, bool ta, bool tb) {
    auto p = planMatmul(a, b, c, ta, tb);
    EXPECT_TRUE(p);
    return *p;
  };
  // gpt2-small's LM head: padded, C in chunks within the 256 MiB bound.
  GemmPlan head = plan(bf16({8192, 768}), bf16({50257, 768}),
                       bf16({8192, 50257}), false, true);
  auto pad = planPadding(head);
  ASSERT_TRUE(pad);
  EXPECT_TRUE(pad->padC);
  EXPECT_FALSE(pad->padA);
  EXPECT_LE(pad->scratchBytes, kGemmPadScratchBytes);
  EXPECT_EQ(pad->chunkM % 64, 0);
  EXPECT_GT(pad->chunkM, 1024);
  GemmPlan dw = plan(bf16({8192, 50257}), bf16({8192, 768}),
                     bf16({50257, 768}), true, false);
  pad = planPadding(dw);
  ASSERT_TRUE(pad);
  EXPECT_TRUE(pad->padA);
  EXPECT_LE(pad->scratchBytes, kGemmPadScratchBytes);
  // Aligned, f32, small, or an unaligned B: as planned.
  EXPECT_FALSE(planPadding(plan(bf16({8192, 768}), bf16({50304, 768}),
                                bf16({8192, 50304}), false, true)));
  EXPECT_FALSE(planPadding(plan(f32({8192, 768}), f32({50257, 768}),
                                f32({8192, 50257}), false, true)));
  EXPECT_FALSE(planPadding(plan(bf16({64, 32}), bf16({203, 32}),
                                bf16({64, 203}), false, true)));
  EXPECT_FALSE(planPadding(plan(bf16({8192, 768}), bf16({768, 50257}),
                                bf16({8192, 50257}), false, false)));
  // Too little scratch for 64 rows: as planned.
  EXPECT_FALSE(planPadding(head, 1 << 20));
}

TEST(GemmPlan, ErrorsSayWhatWasExpected) {
  auto p = planMatmul(f32({3, 5}), f32({4, 2}), f32({3, 2}), false, false);
  ASSERT_FALSE(p);
  EXPECT_NE(p.status().message().find("contraction dims differ"), std::string::npos);
  p = planMatmul(f32({2, 3, 5}), f32({3, 5, 2}), f32({2, 3, 2}), false, false);
  ASSERT_FALSE(p);
  EXPECT_NE(p.status().message().find("do not broadcast"), std::string::npos);
  p = planMatmul(f32({3, 5}), f32({5, 2}), f32({3, 3}), false, false);
  ASSERT_FALSE(p);
  EXPECT_NE(p.status().message().find("expects result of shape [3, 2]"), std::string::npos)
      << p.status().message();
  p = planMatmul(TensorType{DType::I32, {3, 5}}, TensorType{DType::I32, {5, 2}},
                 TensorType{DType::I32, {3, 2}}, false, false);
  ASSERT_FALSE(p);
  EXPECT_NE(p.status().message().find("float element type"), std::string::npos);
  p = planMatmul(f32({5}), f32({5, 2}), f32({2}), false, false);
  ASSERT_FALSE(p);
  EXPECT_NE(p.status().message().find("rank >= 2"), std::string::npos);
}

} // namespace
