//===- Matmul.cpp - Batched, broadcasting matmul on OpenBLAS sgemm --------===//
//
// Every float type goes through cblas_sgemm: f16/bf16 operands are widened
// into f32 buffers first and the f32 result is rounded once on store, which
// gives the "accumulated in f32" semantics of docs/ops.md. When `b` has no
// batch (a linear layer), all of `a`'s batches fold into one tall GEMM.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/KernelUtil.h"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <vector>

namespace dlopt::rt::cpu {

void gemmF32(bool transA, bool transB, int64_t m, int64_t n, int64_t k,
             float alpha, const float *a, int64_t lda, const float *b,
             int64_t ldb, float beta, float *c, int64_t ldc) {
  if (m == 0 || n == 0)
    return;
  if (k == 0) {
    // BLAS leaves C scaled by beta; with no products that is the answer.
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans,
              transB ? CblasTrans : CblasNoTrans, int(m), int(n), int(k), alpha,
              a, int(std::max<int64_t>(lda, 1)), b,
              int(std::max<int64_t>(ldb, 1)), beta, c,
              int(std::max<int64_t>(ldc, 1)));
}

namespace {

Status matmulKernel(const Instr &instr, Ins ins, Outs outs) {
  const TensorType &ta = ins[0].type, &tb = ins[1].type;
  MatmulDims md;
  DLOPT_RETURN_IF_ERROR(matmulDims(instr, ta, tb, md));
  const bool transA = md.transA, transB = md.transB;
  const int64_t m = md.m, n = md.n, k = md.k;
  const std::vector<int64_t> &batch = md.batch;
  std::vector<int64_t> aBatch(ta.shape.begin(), ta.shape.end() - 2);
  std::vector<int64_t> bBatch(tb.shape.begin(), tb.shape.end() - 2);
  if (outs[0].numElements() == 0)
    return Status::ok();

  // Per batch dim of the result, the operand's stride in matrices.
  auto batchStrides = [&](const std::vector<int64_t> &s) {
    std::vector<int64_t> st(batch.size(), 0), cs = contiguousStrides(s);
    size_t lead = batch.size() - s.size();
    for (size_t j = 0; j < s.size(); ++j)
      st[lead + j] = s[j] == 1 ? 0 : cs[j];
    return st;
  };
  std::vector<int64_t> aStrides = batchStrides(aBatch);
  std::vector<int64_t> bStrides = batchStrides(bBatch);
  int64_t numBatch = product(batch, 0, batch.size());
  int64_t numABatch = product(aBatch, 0, aBatch.size());
  int64_t numBBatch = product(bBatch, 0, bBatch.size());

  return dispatchFloat(ta.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    std::vector<float> abuf, bbuf, cbuf;
    const float *a = asF32<T>(ins[0], abuf);
    const float *b = asF32<T>(ins[1], bbuf);
    float *c = outF32<T>(outs[0], cbuf);
    int64_t lda = transA ? m : k, ldb = transB ? k : n;
    if (numBBatch == 1 && numABatch == numBatch && !transA) {
      // [batch*M, K] x [K, N] in one call.
      gemmF32(false, transB, numBatch * m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c,
              n);
    } else {
      for (int64_t i = 0; i < numBatch; ++i) {
        // Offsets in whole matrices; broadcast batch dims have stride 0.
        int64_t offA = 0, offB = 0, rem = i;
        for (size_t d = batch.size(); d-- > 0;) {
          int64_t idx = rem % batch[d];
          rem /= batch[d];
          offA += idx * aStrides[d];
          offB += idx * bStrides[d];
        }
        gemmF32(transA, transB, m, n, k, 1.0f, a + offA * m * k, lda,
                b + offB * k * n, ldb, 0.0f, c + i * m * n, n);
      }
    }
    finishF32<T>(outs[0], c);
    return Status::ok();
  });
}

} // namespace

void registerMatmulKernels(KernelRegistry &r) { r["matmul"] = matmulKernel; }

} // namespace dlopt::rt::cpu
