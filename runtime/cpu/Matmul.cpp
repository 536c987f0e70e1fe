//===- Matmul.cpp - Batched, broadcasting matmul on OpenBLAS sgemm --------===//
//
// Every float type goes through cblas_sgemm: f16/bf16 operands are widened
// into f32 buffers first and the f32 result is rounded once on store, which
// gives the "accumulated in f32" semantics of docs/ops.md. When `b` has no
// batch (a linear layer), all of `a`'s batches fold into one tall GEMM.
//
// Threads: OpenBLAS's own threading changes its results with the thread
// count (its threaded sgemm sums in another order: measured on Debian 12's
// 0.3.21 for 64x64x512 and 512x64x64), which would make a step's bits
// depend on the machine's cores or a process's CPU affinity (mpirun binds
// processes to cores). So OpenBLAS runs single-threaded and gemmF32 splits
// a large GEMM itself into blocks whose bounds depend only on the shape,
// handed to the kernel pool (ThreadPool.h): the same calls, so the same
// bits, for any thread count and any process layout.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/KernelUtil.h"
#include "runtime/cpu/ThreadPool.h"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <mutex>
#include <vector>

// OpenBLAS's thread control (absent from other BLAS libraries: weak).
extern "C" void openblas_set_num_threads(int) __attribute__((weak));
extern "C" int blas_thread_shutdown_(void) __attribute__((weak));

namespace dlopt::rt::cpu {

namespace {

/// One single-threaded sgemm call.
void sgemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k,
           float alpha, const float *a, int64_t lda, const float *b,
           int64_t ldb, float beta, float *c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans,
              transB ? CblasTrans : CblasNoTrans, int(m), int(n), int(k), alpha,
              a, int(std::max<int64_t>(lda, 1)), b,
              int(std::max<int64_t>(ldb, 1)), beta, c,
              int(std::max<int64_t>(ldc, 1)));
}

/// Rows or columns of C per block of a split GEMM, and the work (M*N*K
/// multiply-adds, ~40 us on one core) below which a GEMM stays one call.
/// It was 2^23 while a fork-join of the pool cost 20-60 us (an MLP's
/// 32x784x256 forward then ran slower on two threads than on one); at
/// 0.6-10 us (ThreadPool.cpp) that forward, split in two column blocks,
/// takes 0.090 ms on two threads against 0.166 on one (2^19 measured the
/// same as 2^21 there).
constexpr int64_t kGemmBlock = 128;
constexpr int64_t kGemmSplitFlops = int64_t(1) << 21;

/// The block of a split along `extent`: an eighth of it in multiples of
/// kGemmBlock, between kGemmBlock and 4 kGemmBlock. Every sgemm call packs
/// the whole other operand again, so blocks of 128 cost 10-25% on large
/// GEMMs (measured on 512x8192x256 and 8192x256x512, one thread); eight or
/// more blocks still feed eight threads. A function of the shape only.
int64_t gemmBlockOf(int64_t extent) {
  int64_t eighth = (extent / 8) / kGemmBlock * kGemmBlock;
  return std::clamp<int64_t>(eighth, kGemmBlock, 4 * kGemmBlock);
}

} // namespace

int64_t gemmSplitMultiplyAdds() { return kGemmSplitFlops; }

void useSerialBlas() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (openblas_set_num_threads)
      openblas_set_num_threads(1);
    // The pthread build starts its server threads when the library loads,
    // and they spin on sched_yield for about 2^28 cycles (0.1 s) before
    // sleeping: on two cores that took a core from the kernel pool for the
    // first ~20 steps of a small model (50 resnet-tiny steps: 0.18 s wall,
    // 0.15 s system time; 0.12 s and 0.02 s without them). With one BLAS
    // thread they never get work, so they are stopped; OpenBLAS only
    // restarts them for a threaded call, which one thread never makes.
    if (blas_thread_shutdown_)
      blas_thread_shutdown_();
  });
}

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
  useSerialBlas();
  if (m * n * k < kGemmSplitFlops || (m <= kGemmBlock && n <= kGemmBlock)) {
    sgemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  // Blocks of rows of C (taller than wide) or of columns; fixed by the
  // shape, whatever runs them.
  const bool byRows = m >= n;
  const int64_t extent = byRows ? m : n;
  const int64_t block = gemmBlockOf(extent);
  const int64_t blocks = (extent + block - 1) / block;
  parallelFor(blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t lo = blk * block, len = std::min(block, extent - lo);
      if (byRows)
        sgemm(transA, transB, len, n, k, alpha,
              transA ? a + lo : a + lo * lda, lda, b, ldb, beta,
              c + lo * ldc, ldc);
      else
        sgemm(transA, transB, m, len, k, alpha, a, lda,
              transB ? b + lo * ldb : b + lo, ldb, beta, c + lo, ldc);
    }
  });
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
      // One GEMM per batch, the batches spread over the kernel pool (each
      // GEMM is then one call: the same bits for any thread count).
      parallelFor(numBatch, grainFor(m * n * k), [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
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
      });
    }
    finishF32<T>(outs[0], c);
    return Status::ok();
  });
}

} // namespace

void registerMatmulKernels(KernelRegistry &r) { r["matmul"] = matmulKernel; }

} // namespace dlopt::rt::cpu
