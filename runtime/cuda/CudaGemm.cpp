//===- CudaGemm.cpp - dlopt matmul on cuBLASLt ----------------------------===//

#include "runtime/cuda/CudaGemm.h"
#include "runtime/format/OpTable.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <string>

namespace dlopt::rt::cuda {

namespace {

int cudaType(DType t) {
  switch (t) {
  case DType::F16: return CUDA_R_16F;
  case DType::BF16: return CUDA_R_16BF;
  default: return CUDA_R_32F;
  }
}

/// Largest power of two (<= 256) dividing the address.
unsigned alignmentOf(const void *p) {
  auto v = reinterpret_cast<uintptr_t>(p);
  unsigned a = 256;
  while (a > 1 && v % a != 0)
    a /= 2;
  return a;
}

int64_t roundUp8(int64_t x) { return (x + 7) / 8 * 8; }

} // namespace

namespace {
std::atomic<int> gPad{-1};
} // namespace

void setGemmPadding(bool on) { gPad.store(on ? 1 : 0); }

bool gemmPadding() {
  int v = gPad.load();
  if (v < 0) {
    const char *e = std::getenv("DLOPT_CUDA_GEMM_PAD");
    int fromEnv = e && std::string(e) == "1" ? 1 : 0;
    gPad.compare_exchange_strong(v, fromEnv);
    v = gPad.load();
  }
  return v == 1;
}

std::optional<GemmPadding> planPadding(const GemmPlan &p, int64_t maxScratch,
                                       double minFlops) {
  if (p.dtype != DType::BF16 && p.dtype != DType::F16)
    return std::nullopt;
  if (p.calls() != 1 || p.batchCount != 1 || p.ldaSet || p.ldcSet)
    return std::nullopt;
  if (2.0 * double(p.m) * double(p.n) * double(p.k) < minFlops)
    return std::nullopt;
  GemmPadding g;
  g.padA = p.lda() % 8 != 0;
  g.padC = p.ldc() % 8 != 0;
  if ((!g.padA && !g.padC) || p.ldb() % 8 != 0)
    return std::nullopt;
  const int64_t es = dtypeSize(p.dtype);
  // Scratch bytes per row of C: the A row (or, transposed, A column) and
  // the padded C row.
  int64_t perRow = (g.padA ? (p.transA ? p.k : roundUp8(p.k)) : 0) +
                   (g.padC ? roundUp8(p.n) : 0);
  // A transposed A's copy rounds its width up by at most 7 columns; 256
  // bytes keep C's part aligned.
  int64_t fixed = (g.padA && p.transA ? 7 * p.k * es : 0) + 256;
  int64_t rows = maxScratch > fixed ? (maxScratch - fixed) / (perRow * es) : 0;
  rows = rows >= p.m ? p.m : rows / 64 * 64;
  if (rows < 64)
    return std::nullopt;
  g.chunkM = rows;
  int64_t aBytes =
      g.padA ? (p.transA ? p.k * roundUp8(rows) : rows * roundUp8(p.k)) * es
             : 0;
  g.cOffset = (aBytes + 255) / 256 * 256;
  g.scratchBytes = g.cOffset + (g.padC ? rows * roundUp8(p.n) * es : 0);
  return g;
}

Expected<GemmPlan> planMatmul(const TensorType &ta, const TensorType &tb,
                              const TensorType &tc, bool transA, bool transB) {
  if (!isFloat(ta.dtype))
    return Status::error("expects operand #0 to have a float element type, "
                         "got " + typeStr(ta));
  if (tc.dtype != ta.dtype)
    return Status::error(std::string("expects result to have element type ") +
                         dtypeName(ta.dtype) + ", got " + dtypeName(tc.dtype));
  // The op table's matmul rule (runtime/format/OpTable.h).
  MatmulDims md;
  DLOPT_RETURN_IF_ERROR(matmulShapes(ta, tb, transA, transB, md));
  GemmPlan p;
  p.dtype = ta.dtype;
  p.transA = transA;
  p.transB = transB;
  p.m = md.m;
  p.n = md.n;
  p.k = md.k;
  const std::vector<int64_t> &batch = md.batch;
  std::vector<int64_t> aBatch(ta.shape.begin(), ta.shape.end() - 2);
  std::vector<int64_t> bBatch(tb.shape.begin(), tb.shape.end() - 2);
  std::vector<int64_t> expected = batch;
  expected.push_back(p.m);
  expected.push_back(p.n);
  if (tc.shape != expected)
    return Status::error("expects result of shape " + shapeStr(expected) +
                         ", got " + shapeStr(tc.shape));

  int64_t mk = p.m * p.k, kn = p.k * p.n, mn = p.m * p.n;
  int64_t numBatch = 1, numA = 1, numB = 1;
  for (int64_t d : batch)
    numBatch *= d;
  for (int64_t d : aBatch)
    numA *= d;
  for (int64_t d : bBatch)
    numB *= d;

  // A linear layer: every batch of `a` against one `b` is one tall GEMM.
  if (numB == 1 && numA == numBatch && !transA && numBatch > 1) {
    p.m *= numBatch;
    p.aOffsets = {0};
    p.bOffsets = {0};
    p.cOffsets = {0};
    return p;
  }

  // Per batch dim: stride in whole matrices of each operand (0 when it
  // broadcasts), size-1 dims dropped, mergeable neighbours merged.
  auto strides = [&](const std::vector<int64_t> &s) {
    std::vector<int64_t> st(batch.size(), 0);
    int64_t acc = 1;
    for (size_t j = s.size(); j-- > 0;) {
      size_t d = batch.size() - s.size() + j;
      st[d] = s[j] == 1 ? 0 : acc;
      acc *= s[j];
    }
    return st;
  };
  std::vector<int64_t> sa = strides(aBatch), sb = strides(bBatch);
  std::vector<int64_t> sc(batch.size(), 0);
  for (size_t d = batch.size(), acc = 1; d-- > 0;) {
    sc[d] = int64_t(acc);
    acc *= size_t(batch[d]);
  }
  struct Dim {
    int64_t size, a, b, c;
  };
  std::vector<Dim> dims;
  for (size_t d = 0; d < batch.size(); ++d) {
    if (batch[d] == 1)
      continue;
    Dim cur{batch[d], sa[d], sb[d], sc[d]};
    if (!dims.empty()) {
      Dim &prev = dims.back();
      if (prev.a == cur.a * cur.size && prev.b == cur.b * cur.size &&
          prev.c == cur.c * cur.size) {
        prev.size *= cur.size;
        prev.a = cur.a;
        prev.b = cur.b;
        prev.c = cur.c;
        continue;
      }
    }
    dims.push_back(cur);
  }
  if (dims.empty())
    dims.push_back({1, 0, 0, 0});
  Dim inner = dims.back();
  dims.pop_back();
  p.batchCount = inner.size;
  p.strideA = inner.a * mk;
  p.strideB = inner.b * kn;
  p.strideC = inner.c * mn;
  // The remaining dims become a loop of calls, in row-major order.
  int64_t calls = 1;
  for (const Dim &d : dims)
    calls *= d.size;
  for (int64_t i = 0; i < calls; ++i) {
    int64_t rem = i, oa = 0, ob = 0, oc = 0;
    for (size_t d = dims.size(); d-- > 0;) {
      int64_t idx = rem % dims[d].size;
      rem /= dims[d].size;
      oa += idx * dims[d].a;
      ob += idx * dims[d].b;
      oc += idx * dims[d].c;
    }
    p.aOffsets.push_back(oa * mk);
    p.bOffsets.push_back(ob * kn);
    p.cOffsets.push_back(oc * mn);
  }
  return p;
}

//===----------------------------------------------------------------------===//
// GemmRunner
//===----------------------------------------------------------------------===//

struct GemmRunner::Cached {
  const CudaLibrary *lib = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Cached() {
    if (a)
      (void)lib->cublasLtMatrixLayoutDestroy(a);
    if (b)
      (void)lib->cublasLtMatrixLayoutDestroy(b);
    if (c)
      (void)lib->cublasLtMatrixLayoutDestroy(c);
    if (desc)
      (void)lib->cublasLtMatmulDescDestroy(desc);
  }
};

GemmRunner::GemmRunner(const CudaLibrary &lib, cublasLtHandle_t handle,
                       void *workspace, size_t workspaceBytes, bool tf32)
    : lib_(lib), handle_(handle), workspace_(workspace),
      workspaceBytes_(workspaceBytes), tf32_(tf32) {}

GemmRunner::~GemmRunner() = default;

Expected<GemmRunner::Cached *> GemmRunner::lookup(const GemmPlan &p,
                                                  unsigned alignment) {
  Key key{int(p.dtype), p.transA, p.transB, p.m,         p.n,
          p.k,           p.batchCount, p.strideA, p.strideB, p.strideC,
          alignment,     p.lda(),      p.ldc()};
  auto it = cache_.find(key);
  if (it != cache_.end())
    return it->second.get();
  auto c = std::make_unique<Cached>();
  c->lib = &lib_;
  int type = cudaType(p.dtype);
  int compute = p.dtype == DType::F32 && tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32
                                               : CUBLAS_COMPUTE_32F;
  DLOPT_CUBLAS_CHECK(lib_.cublasLtMatmulDescCreate(&c->desc, compute,
                                                   CUDA_R_32F));
  // Column-major C^T = op(B^T) op(A^T): B plays cuBLAS's A and vice versa.
  int32_t opA = p.transB ? CUBLAS_OP_T : CUBLAS_OP_N;
  int32_t opB = p.transA ? CUBLAS_OP_T : CUBLAS_OP_N;
  DLOPT_CUBLAS_CHECK(lib_.cublasLtMatmulDescSetAttribute(
      c->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof opA));
  DLOPT_CUBLAS_CHECK(lib_.cublasLtMatmulDescSetAttribute(
      c->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof opB));
  // Stored (column-major) shapes: B row-major [K,N] is col-major N x K.
  uint64_t aRows = p.transB ? p.k : p.n, aCols = p.transB ? p.n : p.k;
  uint64_t bRows = p.transA ? p.m : p.k, bCols = p.transA ? p.k : p.m;
  DLOPT_CUBLAS_CHECK(lib_.cublasLtMatrixLayoutCreate(&c->a, type, aRows, aCols,
                                                     int64_t(aRows)));
  DLOPT_CUBLAS_CHECK(lib_.cublasLtMatrixLayoutCreate(&c->b, type, bRows, bCols,
                                                     p.lda()));
  DLOPT_CUBLAS_CHECK(lib_.cublasLtMatrixLayoutCreate(
      &c->c, type, uint64_t(p.n), uint64_t(p.m), p.ldc()));
  if (p.batchCount > 1) {
    int32_t count = int32_t(p.batchCount);
    struct {
      cublasLtMatrixLayout_t l;
      int64_t stride;
    } layouts[] = {{c->a, p.strideB}, {c->b, p.strideA}, {c->c, p.strideC}};
    for (auto &l : layouts) {
      DLOPT_CUBLAS_CHECK(lib_.cublasLtMatrixLayoutSetAttribute(
          l.l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
      DLOPT_CUBLAS_CHECK(lib_.cublasLtMatrixLayoutSetAttribute(
          l.l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &l.stride,
          sizeof l.stride));
    }
  }
  cublasLtMatmulPreference_t pref = nullptr;
  DLOPT_CUBLAS_CHECK(lib_.cublasLtMatmulPreferenceCreate(&pref));
  struct PrefGuard {
    const CudaLibrary &lib;
    cublasLtMatmulPreference_t p;
    ~PrefGuard() { (void)lib.cublasLtMatmulPreferenceDestroy(p); }
  } guard{lib_, pref};
  uint64_t ws = workspaceBytes_;
  DLOPT_CUBLAS_CHECK(lib_.cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  uint32_t align = alignment;
  for (int attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                   CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                   CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                   CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    DLOPT_CUBLAS_CHECK(lib_.cublasLtMatmulPreferenceSetAttribute(
        pref, attr, &align, sizeof align));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  DLOPT_CUBLAS_CHECK(lib_.cublasLtMatmulAlgoGetHeuristic(
      handle_, c->desc, c->a, c->b, c->c, c->c, pref, 1, &result, &found));
  if (found < 1)
    return Status::error(
        std::string("cuBLASLt has no algorithm for a ") + dtypeName(p.dtype) +
        " GEMM m=" + std::to_string(p.m) + " n=" + std::to_string(p.n) +
        " k=" + std::to_string(p.k) + " batch=" +
        std::to_string(p.batchCount) + " (alignment " +
        std::to_string(alignment) + " bytes)");
  c->algo = result.algo;
  Cached *raw = c.get();
  cache_.emplace(key, std::move(c));
  return raw;
}

Status GemmRunner::run(
    const GemmPlan &p, const void *a, const void *b, void *c,
    cudaStream_t stream,
    const std::function<Expected<void *>(int64_t)> &scratch) {
  std::optional<GemmPadding> pad;
  if (scratch && gemmPadding() && p.m > 0 && p.n > 0 && p.k > 0)
    pad = planPadding(p);
  if (!pad)
    return call(p, a, b, c, stream);
  Expected<void *> ws = scratch(pad->scratchBytes);
  if (!ws)
    return ws.status();
  const int64_t es = dtypeSize(p.dtype);
  char *sbase = static_cast<char *>(*ws);
  auto copy = [&](char *dst, const char *src, const PadCopy &c) {
    return lib_.cudaMemcpy2DAsync(
        dst + c.dstOffset * es, size_t(c.dstPitch * es),
        src + c.srcOffset * es, size_t(c.srcPitch * es), size_t(c.width * es),
        size_t(c.height), cudaMemcpyDeviceToDevice, stream);
  };
  for (const PadStep &st : padSteps(p, *pad)) {
    if (st.copyA)
      DLOPT_CUDA_CHECK(copy(sbase, static_cast<const char *>(a), *st.copyA));
    DLOPT_RETURN_IF_ERROR(call(st.gemm, st.aInScratch ? sbase : a, b,
                               st.cInScratch ? sbase : c, stream));
    if (st.copyC)
      DLOPT_CUDA_CHECK(copy(static_cast<char *>(c), sbase, *st.copyC));
  }
  return Status::ok();
}

std::vector<PadStep> padSteps(const GemmPlan &p, const GemmPadding &g) {
  std::vector<PadStep> steps;
  const int64_t es = dtypeSize(p.dtype), cAt = g.cOffset / es;
  for (int64_t m0 = 0; m0 < p.m; m0 += g.chunkM) {
    const int64_t mc = std::min(g.chunkM, p.m - m0);
    PadStep st;
    st.gemm = p;
    st.gemm.m = mc;
    // Rows m0.. of A [M, K], or columns m0.. of A [K, M] (transposed).
    const int64_t aAt = p.aOffsets[0] + (p.transA ? m0 : m0 * p.lda());
    const int64_t cAtC = p.cOffsets[0] + m0 * p.ldc();
    if (g.padA) {
      PadCopy c;
      c.width = p.transA ? mc : p.k;
      c.height = p.transA ? p.k : mc;
      c.srcOffset = aAt;
      c.srcPitch = p.lda();
      c.dstPitch = roundUp8(c.width);
      st.copyA = c;
      st.aInScratch = true;
      st.gemm.aOffsets = {0};
      st.gemm.ldaSet = c.dstPitch;
    } else {
      st.gemm.aOffsets = {aAt};
      st.gemm.ldaSet = p.lda();
    }
    if (g.padC) {
      st.cInScratch = true;
      st.gemm.cOffsets = {cAt};
      st.gemm.ldcSet = roundUp8(p.n);
      PadCopy c;
      c.srcOffset = cAt;
      c.srcPitch = st.gemm.ldcSet;
      c.dstOffset = cAtC;
      c.dstPitch = p.ldc();
      c.width = p.n;
      c.height = mc;
      st.copyC = c;
    } else {
      st.gemm.cOffsets = {cAtC};
      st.gemm.ldcSet = p.ldc();
    }
    steps.push_back(std::move(st));
  }
  return steps;
}

Status GemmRunner::call(const GemmPlan &p, const void *a, const void *b,
                        void *c, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0)
    return Status::ok();
  int64_t es = dtypeSize(p.dtype);
  if (p.k == 0) {
    // No products: the result is zeros (cuBLAS would only scale C by beta).
    for (int64_t i = 0; i < p.calls(); ++i)
      DLOPT_CUDA_CHECK(lib_.cudaMemsetAsync(
          static_cast<char *>(c) + p.cOffsets[i] * es, 0,
          size_t(p.m * p.n * std::max<int64_t>(p.batchCount, 1) * es),
          stream));
    return Status::ok();
  }
  // The alignment every call's pointers (and batch strides) satisfy.
  unsigned align = 256;
  auto note = [&](const void *base, int64_t off) {
    align = std::min(align,
                     alignmentOf(static_cast<const char *>(base) + off * es));
  };
  for (int64_t i = 0; i < p.calls(); ++i) {
    note(a, p.aOffsets[i]);
    note(b, p.bOffsets[i]);
    note(c, p.cOffsets[i]);
  }
  if (p.batchCount > 1) {
    note(a, p.strideA);
    note(b, p.strideB);
    note(c, p.strideC);
  }
  align = std::min({align, alignmentOf(a), alignmentOf(b), alignmentOf(c)});
  Expected<Cached *> cached = lookup(p, align);
  if (!cached)
    return cached.status();
  Cached &cc = **cached;
  const float alpha = 1.0f, beta = 0.0f;
  for (int64_t i = 0; i < p.calls(); ++i) {
    const char *pa = static_cast<const char *>(a) + p.aOffsets[i] * es;
    const char *pb = static_cast<const char *>(b) + p.bOffsets[i] * es;
    char *pc = static_cast<char *>(c) + p.cOffsets[i] * es;
    DLOPT_CUBLAS_CHECK(lib_.cublasLtMatmul(
        handle_, cc.desc, &alpha, pb, cc.a, pa, cc.b, &beta, pc, cc.c, pc,
        cc.c, &cc.algo, workspace_, workspaceBytes_, stream));
  }
  return Status::ok();
}

} // namespace dlopt::rt::cuda
