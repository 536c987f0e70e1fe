//===- DnnlConv.cpp - conv2d and its gradients through oneDNN -------------===//
//
// See DnnlConv.h. Per instruction: the filter is reordered once into the
// primitive's layout (oneDNN's blocked formats), then the chunks of images
// run in parallel on the kernel pool, each reordering its NCHW slice into
// the primitive's layout and back through per-thread buffers. Primitives
// (and their reorders) are created once per shape and cached; they use a
// user-provided scratchpad, so one primitive can run on several workers at
// once.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/DnnlConv.h"

#include "runtime/cpu/ThreadPool.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <tuple>
#include <vector>

#ifdef DLOPT_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>
// Debian's oneDNN threads with OpenMP (libgomp); a worker's team is set to
// one thread before each call.
extern "C" void omp_set_num_threads(int);
#endif

namespace dlopt::rt::cpu {

namespace {
std::atomic<int> gPathOverride{-1};
} // namespace

void setConvPath(ConvPath path) { gPathOverride.store(int(path)); }

ConvPath convPath() {
  const int o = gPathOverride.load();
  if (o >= 0)
    return ConvPath(o);
  static const ConvPath env = [] {
    const char *e = std::getenv("DLOPT_CONV");
    if (!e || !*e || !std::strcmp(e, "auto") || !std::strcmp(e, "onednn"))
      return ConvPath::Auto;
    if (!std::strcmp(e, "im2col"))
      return ConvPath::Im2col;
    std::fprintf(stderr,
                 "dlopt: warning: DLOPT_CONV=%s is not one of auto, onednn, "
                 "im2col; using auto\n",
                 e);
    return ConvPath::Auto;
  }();
  return env;
}

#ifndef DLOPT_HAVE_DNNL

bool haveDnnl() { return false; }
const char *convImplementationName() { return "im2col + sgemm"; }
bool dnnlConvForward(const ConvGeom &, int64_t, int64_t, int64_t,
                     const float *, const float *, float *) {
  return false;
}
bool dnnlConvBackwardData(const ConvGeom &, int64_t, int64_t, int64_t,
                          const float *, const float *, float *) {
  return false;
}
bool dnnlConvBackwardWeights(const ConvGeom &, int64_t, int64_t, int64_t,
                             const float *, const float *, float *) {
  return false;
}

#else

bool haveDnnl() { return true; }

namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using DT = memory::data_type;

enum class Kind { Forward, BackwardData, BackwardWeights };

/// Output pixels a chunk should hold at least: one image of a small plane
/// gives oneDNN's kernels too little to block over, and every chunk pays
/// two reorders and a call (on a Zen 5 core, 8x512x2x2 forward: 0.90 ms as
/// 8 one-image calls, 0.60 as one call; cnn-small's 64x16x14x14 forward
/// 0.65 ms in chunks of 32 pixels, 0.56 in chunks of 1024).
constexpr int64_t kMinChunkPixels = 1024;
/// Where im2col + sgemm is the faster path (dlopt-bench-cpu-conv, one
/// Zen 5 core; docs/performance.md): the input gradient of a convolution
/// with fewer input channels per group than this (a first layer over RGB
/// or grey images: oneDNN 0.3-0.5x im2col's speed), and the filter gradient
/// over fewer output pixels (all images) than this, where the GEMM's inner
/// dim is those pixels and oneDNN's reorders of a large filter cost more
/// than the product (resnet18's 512x512x3x3 on 2x2 planes: 0.8x).
constexpr int64_t kMinGradInputChannels = 8;
constexpr int64_t kMinGradFilterPixels = 64;
/// Floats of partial filter gradients the chunks of conv2d_grad_filter may
/// hold (8 MiB); with larger filters fewer chunks run.
constexpr int64_t kMaxPartialFloats = int64_t(1) << 21;

/// Images per chunk when n images are cut into chunks of at most nb: the
/// same number of chunks with sizes as even as possible.
int64_t evenChunk(int64_t n, int64_t nb) {
  const int64_t chunks = (n + nb - 1) / std::max<int64_t>(nb, 1);
  return chunks > 0 ? (n + chunks - 1) / chunks : 1;
}

/// Images per chunk of the forward and input-gradient passes: at least
/// kMinChunkPixels output pixels, and two chunks or more when there are two
/// images (so two workers have work). A function of the shape only.
int64_t imagesPerChunk(int64_t n, int64_t plane) {
  int64_t nb = (kMinChunkPixels + plane - 1) / std::max<int64_t>(plane, 1);
  nb = std::clamp<int64_t>(nb, 1, std::max<int64_t>((n + 1) / 2, 1));
  return evenChunk(n, nb);
}

struct Key {
  Kind kind;
  int64_t mb, c, h, w, o, cg, kh, kw, sh, sw, ph, pw, dh, dw, groups;
  auto tie() const {
    return std::tie(kind, mb, c, h, w, o, cg, kh, kw, sh, sw, ph, pw, dh, dw,
                    groups);
  }
  bool operator<(const Key &k) const { return tie() < k.tie(); }
};

dnnl::engine &engine();

/// One shape's primitive and the reorders around it. For the forward,
/// `a` is the source and `b` the destination; for the input gradient `a`
/// is dy and `b` dx; for the filter gradient `a` is x, `c` dy, and the
/// weights are the result.
struct Prim {
  bool ok = false;
  dnnl::primitive conv;
  memory::desc a, b, c, wei, scratch;           // the primitive's layouts
  memory::desc userA, userB, userC, userWei;    // NCHW / OIHW
  bool sameA = true, sameB = true, sameC = true, sameWei = true;
  dnnl::reorder toA, fromB, toC, toWei, fromWei;
  /// The filter reorder (toWei or fromWei) cut into slices of output
  /// channels that run in parallel: the user's and the primitive's
  /// sub-layouts of each slice, and its reorder. Empty: one reorder.
  std::vector<memory::desc> userWeiSlices, weiSlices;
  std::vector<dnnl::reorder> weiSliceReorders;
};

/// Slices of output channels for a filter of `o` channels (ungrouped):
/// 8, 4 or 2 slices of a multiple of 16 channels (a multiple of every
/// blocked layout's channel block), or 1.
int64_t filterSlices(int64_t o, int64_t groups) {
  if (groups != 1)
    return 1;
  for (int64_t s : {8, 4, 2})
    if (o % (16 * s) == 0)
      return s;
  return 1;
}

/// Fills p's filter slices (userWei -> wei when `in`, else back). Leaves
/// them empty when oneDNN refuses a sub-layout.
void sliceFilterReorder(Prim &p, const Key &k, bool in) {
  const int64_t slices = filterSlices(k.o, k.groups);
  if (slices < 2)
    return;
  const int64_t per = k.o / slices;
  try {
    for (int64_t i = 0; i < slices; ++i) {
      const memory::dims dims{per, k.cg, k.kh, k.kw}, off{i * per, 0, 0, 0};
      memory::desc u = p.userWei.submemory_desc(dims, off),
                   w = p.wei.submemory_desc(dims, off);
      p.userWeiSlices.push_back(u);
      p.weiSlices.push_back(w);
      p.weiSliceReorders.push_back(dnnl::reorder(
          in ? dnnl::reorder::primitive_desc(engine(), u, engine(), w)
             : dnnl::reorder::primitive_desc(engine(), w, engine(), u)));
    }
  } catch (const dnnl::error &) {
    p.userWeiSlices.clear();
    p.weiSlices.clear();
    p.weiSliceReorders.clear();
  }
}

dnnl::engine &engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::stream &threadStream() {
  thread_local dnnl::stream s(engine());
  return s;
}

/// A per-thread buffer of 64-byte aligned bytes, grown on demand.
struct Buffer {
  void *p = nullptr;
  size_t size = 0;
  ~Buffer() { std::free(p); }
  void *get(size_t n) {
    if (n > size) {
      std::free(p);
      size = (n + 63) / 64 * 64;
      p = std::aligned_alloc(64, size);
      if (!p)
        size = 0;
    }
    return p;
  }
};

/// A worker's buffers for its chunks (a, b, c, scratch) and the calling
/// thread's for an instruction's filter in the primitive's layout or its
/// partial filter gradients (one buffer: an instruction needs one or the
/// other; kept between calls: a fresh allocation of a 9 MiB filter costs
/// as much in page faults as reordering it).
struct ThreadBuffers {
  Buffer a, b, c, scratch, filter;
};

ThreadBuffers &threadBuffers() {
  thread_local ThreadBuffers t;
  return t;
}

memory::dims weightDims(const Key &k) {
  if (k.groups > 1)
    return {k.groups, k.o / k.groups, k.cg, k.kh, k.kw};
  return {k.o, k.cg, k.kh, k.kw};
}

std::unique_ptr<Prim> create(const Key &k) {
  auto p = std::make_unique<Prim>();
  omp_set_num_threads(1);
  const int64_t oh = (k.h + 2 * k.ph - ((k.kh - 1) * k.dh + 1)) / k.sh + 1;
  const int64_t ow = (k.w + 2 * k.pw - ((k.kw - 1) * k.dw + 1)) / k.sw + 1;
  const memory::dims src{k.mb, k.c, k.h, k.w}, dst{k.mb, k.o, oh, ow},
      wei = weightDims(k), strides{k.sh, k.sw}, dil{k.dh - 1, k.dw - 1},
      padL{k.ph, k.pw},
      padR{(oh - 1) * k.sh + (k.kh - 1) * k.dh + 1 - k.h - k.ph,
           (ow - 1) * k.sw + (k.kw - 1) * k.dw + 1 - k.w - k.pw};
  const memory::desc uSrc(src, DT::f32, Tag::nchw), uDst(dst, DT::f32, Tag::nchw),
      uWei(wei, DT::f32, k.groups > 1 ? Tag::goihw : Tag::oihw);
  const memory::desc anySrc(src, DT::f32, Tag::any),
      anyDst(dst, DT::f32, Tag::any), anyWei(wei, DT::f32, Tag::any);
  try {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    // Always the training forward and the direct algorithm: the same
    // kernels (so the same bits) whatever the program around it.
    dnnl::convolution_forward::desc fd(
        dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
        anySrc, anyWei, anyDst, strides, dil, padL, padR);
    dnnl::convolution_forward::primitive_desc fpd(fd, attr, engine());
    auto reorder = [&](const memory::desc &from, const memory::desc &to) {
      return dnnl::reorder(dnnl::reorder::primitive_desc(engine(), from,
                                                         engine(), to));
    };
    if (k.kind == Kind::Forward) {
      p->conv = dnnl::convolution_forward(fpd);
      p->a = fpd.src_desc();
      p->b = fpd.dst_desc();
      p->wei = fpd.weights_desc();
      p->scratch = fpd.scratchpad_desc();
      p->userA = uSrc;
      p->userB = uDst;
    } else if (k.kind == Kind::BackwardData) {
      dnnl::convolution_backward_data::desc bd(
          dnnl::algorithm::convolution_direct, anySrc, anyWei, anyDst,
          strides, dil, padL, padR);
      dnnl::convolution_backward_data::primitive_desc bpd(bd, attr, engine(),
                                                          fpd);
      p->conv = dnnl::convolution_backward_data(bpd);
      p->a = bpd.diff_dst_desc();
      p->b = bpd.diff_src_desc();
      p->wei = bpd.weights_desc();
      p->scratch = bpd.scratchpad_desc();
      p->userA = uDst;
      p->userB = uSrc;
    } else {
      dnnl::convolution_backward_weights::desc wd(
          dnnl::algorithm::convolution_direct, anySrc, anyWei, anyDst,
          strides, dil, padL, padR);
      dnnl::convolution_backward_weights::primitive_desc wpd(wd, attr,
                                                             engine(), fpd);
      p->conv = dnnl::convolution_backward_weights(wpd);
      p->a = wpd.src_desc();
      p->c = wpd.diff_dst_desc();
      p->wei = wpd.diff_weights_desc();
      p->scratch = wpd.scratchpad_desc();
      p->userA = uSrc;
      p->userC = uDst;
    }
    p->userWei = uWei;
    p->sameA = p->a == p->userA;
    if (!p->sameA)
      p->toA = reorder(p->userA, p->a);
    if (k.kind == Kind::BackwardWeights) {
      p->sameC = p->c == p->userC;
      if (!p->sameC)
        p->toC = reorder(p->userC, p->c);
      p->sameWei = p->wei == p->userWei;
      if (!p->sameWei) {
        p->fromWei = reorder(p->wei, p->userWei);
        sliceFilterReorder(*p, k, /*in=*/false);
      }
    } else {
      p->sameB = p->b == p->userB;
      if (!p->sameB)
        p->fromB = reorder(p->b, p->userB);
      p->sameWei = p->wei == p->userWei;
      if (!p->sameWei) {
        p->toWei = reorder(p->userWei, p->wei);
        sliceFilterReorder(*p, k, /*in=*/true);
      }
    }
    p->ok = true;
  } catch (const dnnl::error &) {
    p->ok = false; // no implementation for the shape: im2col runs it
  }
  return p;
}

/// The cached primitive for `k` (created on first use), or nullptr when
/// oneDNN has none for it.
const Prim *primitiveFor(const Key &k) {
  static std::mutex mu;
  static std::map<Key, std::unique_ptr<Prim>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(k);
  if (it == cache.end())
    it = cache.emplace(k, create(k)).first;
  return it->second->ok ? it->second.get() : nullptr;
}

Key keyOf(Kind kind, const ConvGeom &g, int64_t mb, int64_t c, int64_t o) {
  return Key{kind,        mb,          c,           g.h,          g.w,
             o,           g.cg,        g.kh,        g.kw,         g.stride[0],
             g.stride[1], g.padding[0], g.padding[1], g.dilation[0],
             g.dilation[1], g.groups};
}

bool usable(const ConvGeom &g, int64_t n) {
  return convPath() == ConvPath::Auto && n > 0 && g.oh > 0 && g.ow > 0 &&
         g.stride.size() == 2 && g.padding.size() == 2 &&
         g.dilation.size() == 2;
}

/// Runs run(ci, n0, cnt) for the chunks of `per` images of n in parallel;
/// false when any chunk failed (a oneDNN error).
template <typename F> bool forChunks(int64_t n, int64_t per, F run) {
  std::atomic<bool> ok{true};
  parallelFor((n + per - 1) / per, 1, [&](int64_t b, int64_t e) {
    omp_set_num_threads(1);
    for (int64_t ci = b; ci < e && ok.load(std::memory_order_relaxed); ++ci) {
      const int64_t n0 = ci * per;
      try {
        if (!run(ci, n0, std::min(per, n - n0)))
          ok = false;
      } catch (const std::exception &) {
        ok = false;
      }
    }
  });
  return ok.load();
}

/// `user` (a chunk's NCHW data) as the primitive's layout: the same memory
/// when the layouts agree, else reordered into `buf`.
memory asPrimitive(const memory::desc &userDesc, const memory::desc &desc,
                   bool same, const dnnl::reorder &toPrim, const void *user,
                   Buffer &buf) {
  memory u(userDesc, engine(), const_cast<void *>(user));
  if (same)
    return u;
  void *p = buf.get(desc.get_size());
  if (!p)
    throw std::bad_alloc();
  memory m(desc, engine(), p);
  toPrim.execute(threadStream(), u, m);
  return m;
}

memory scratchOf(const Prim &p, Buffer &buf) {
  const size_t n = p.scratch.get_size();
  void *ptr = n ? buf.get(n) : nullptr;
  if (n && !ptr)
    throw std::bad_alloc();
  return memory(p.scratch, engine(), ptr);
}

/// Reorders a filter between the user's layout (`user`) and the
/// primitive's (`prim`): toWei (in) or fromWei, by slices of output
/// channels in parallel where p has them. A copy either way: the bits do
/// not depend on how it is cut.
bool reorderFilter(const Prim &p, bool in, void *user, void *prim) {
  if (p.weiSliceReorders.empty()) {
    omp_set_num_threads(1);
    memory u(p.userWei, engine(), user), m(p.wei, engine(), prim);
    if (in)
      p.toWei.execute(threadStream(), u, m);
    else
      p.fromWei.execute(threadStream(), m, u);
    threadStream().wait();
    return true;
  }
  return forChunks(int64_t(p.weiSliceReorders.size()), 1,
                   [&](int64_t i, int64_t, int64_t) {
                     memory u(p.userWeiSlices[size_t(i)], engine(), user),
                         m(p.weiSlices[size_t(i)], engine(), prim);
                     if (in)
                       p.weiSliceReorders[size_t(i)].execute(threadStream(), u,
                                                             m);
                     else
                       p.weiSliceReorders[size_t(i)].execute(threadStream(), m,
                                                             u);
                     threadStream().wait();
                     return true;
                   });
}

/// The forward and the input gradient: out = conv(in, w) per chunk, with
/// `w` reordered once for all chunks.
bool runDataPass(Kind kind, const ConvGeom &g, int64_t n, int64_t c,
                 int64_t o, const float *in, const float *w, float *out,
                 int64_t inImage, int64_t outImage) {
  const int64_t per = imagesPerChunk(n, g.oh * g.ow);
  const Prim *full = primitiveFor(keyOf(kind, g, per, c, o));
  const int64_t last = n % per ? n % per : per;
  const Prim *tail =
      last == per ? full : primitiveFor(keyOf(kind, g, last, c, o));
  if (!full || !tail)
    return false;
  // The filter in the primitive's layout, shared by every chunk (both
  // primitives were created for one filter shape and pick one layout).
  const void *wei = w;
  if (!full->sameWei || !tail->sameWei) {
    if (!(full->wei == tail->wei))
      return false;
    try {
      omp_set_num_threads(1);
      void *buf = threadBuffers().filter.get(full->wei.get_size());
      if (!buf || !reorderFilter(*full, /*in=*/true, const_cast<float *>(w),
                                 buf))
        return false;
      wei = buf;
    } catch (const std::exception &) {
      return false;
    }
  }
  return forChunks(n, per, [&](int64_t, int64_t n0, int64_t cnt) {
    const Prim &p = cnt == per ? *full : *tail;
    ThreadBuffers &tb = threadBuffers();
    dnnl::stream &s = threadStream();
    memory a = asPrimitive(p.userA, p.a, p.sameA, p.toA, in + n0 * inImage,
                           tb.a);
    memory ub(p.userB, engine(), out + n0 * outImage);
    memory b = ub;
    if (!p.sameB) {
      void *buf = tb.b.get(p.b.get_size());
      if (!buf)
        return false;
      b = memory(p.b, engine(), buf);
    }
    memory wm(p.wei, engine(), const_cast<void *>(wei));
    memory scratch = scratchOf(p, tb.scratch);
    if (kind == Kind::Forward)
      p.conv.execute(s, {{DNNL_ARG_SRC, a},
                         {DNNL_ARG_WEIGHTS, wm},
                         {DNNL_ARG_DST, b},
                         {DNNL_ARG_SCRATCHPAD, scratch}});
    else
      p.conv.execute(s, {{DNNL_ARG_DIFF_DST, a},
                         {DNNL_ARG_WEIGHTS, wm},
                         {DNNL_ARG_DIFF_SRC, b},
                         {DNNL_ARG_SCRATCHPAD, scratch}});
    if (!p.sameB)
      p.fromB.execute(s, b, ub);
    s.wait();
    return true;
  });
}

} // namespace

const char *convImplementationName() {
  static const std::string name = [] {
    const dnnl_version_t *v = dnnl_version();
    std::string isa;
    switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: isa = "sse4.1"; break;
    case dnnl::cpu_isa::avx: isa = "avx"; break;
    case dnnl::cpu_isa::avx2: isa = "avx2"; break;
    case dnnl::cpu_isa::avx512_core: isa = "avx512"; break;
    case dnnl::cpu_isa::avx512_core_vnni: isa = "avx512 vnni"; break;
    case dnnl::cpu_isa::avx512_core_bf16: isa = "avx512 bf16"; break;
    case dnnl::cpu_isa::avx512_core_amx: isa = "avx512 amx"; break;
    default: isa = "other ISA"; break;
    }
    return "oneDNN " + std::to_string(v->major) + "." +
           std::to_string(v->minor) + "." + std::to_string(v->patch) + " (" +
           isa + ")";
  }();
  return convPath() == ConvPath::Auto ? name.c_str() : "im2col + sgemm";
}

bool dnnlConvForward(const ConvGeom &g, int64_t n, int64_t c, int64_t o,
                     const float *x, const float *w, float *y) {
  if (!usable(g, n))
    return false;
  return runDataPass(Kind::Forward, g, n, c, o, x, w, y, c * g.h * g.w,
                     o * g.oh * g.ow);
}

bool dnnlConvBackwardData(const ConvGeom &g, int64_t n, int64_t c, int64_t o,
                          const float *dy, const float *w, float *dx) {
  if (!usable(g, n) || g.cg < kMinGradInputChannels)
    return false;
  return runDataPass(Kind::BackwardData, g, n, c, o, dy, w, dx,
                     o * g.oh * g.ow, c * g.h * g.w);
}

bool dnnlConvBackwardWeights(const ConvGeom &g, int64_t n, int64_t c,
                             int64_t o, const float *x, const float *dy,
                             float *dw) {
  const int64_t plane = g.oh * g.ow, wsize = o * g.ckk();
  if (!usable(g, n) || n * plane < kMinGradFilterPixels)
    return false;
  // Chunks as in the forward, but no more than kMaxPartialFloats of
  // partial gradients.
  const int64_t fwdPer = imagesPerChunk(n, plane);
  const int64_t maxChunks =
      std::max<int64_t>(1, kMaxPartialFloats / std::max<int64_t>(wsize, 1));
  const int64_t chunks =
      std::min((n + fwdPer - 1) / fwdPer, maxChunks);
  const int64_t per = evenChunk(n, (n + chunks - 1) / chunks);
  const int64_t count = (n + per - 1) / per;
  const Prim *full = primitiveFor(keyOf(Kind::BackwardWeights, g, per, c, o));
  const int64_t last = n % per ? n % per : per;
  const Prim *tail =
      last == per ? full
                  : primitiveFor(keyOf(Kind::BackwardWeights, g, last, c, o));
  if (!full || !tail || !(full->wei == tail->wei))
    return false;
  const size_t weiFloats =
      (full->wei.get_size() + sizeof(float) - 1) / sizeof(float);
  // One chunk in the user's layout writes dw directly; otherwise each
  // chunk writes its own slice of `part`, summed in chunk order.
  const bool direct = count == 1 && full->sameWei;
  // Every chunk overwrites its slice.
  float *part = nullptr;
  if (!direct) {
    part = static_cast<float *>(threadBuffers().filter.get(
        size_t(count) * weiFloats * sizeof(float)));
    if (!part)
      return false;
  }
  const int64_t imageX = c * g.h * g.w, imageDy = o * plane;
  bool ok = forChunks(n, per, [&](int64_t ci, int64_t n0, int64_t cnt) {
    const Prim &p = cnt == per ? *full : *tail;
    ThreadBuffers &tb = threadBuffers();
    dnnl::stream &s = threadStream();
    memory a = asPrimitive(p.userA, p.a, p.sameA, p.toA, x + n0 * imageX,
                           tb.a);
    memory d = asPrimitive(p.userC, p.c, p.sameC, p.toC, dy + n0 * imageDy,
                           tb.c);
    memory wm(p.wei, engine(),
              direct ? static_cast<void *>(dw)
                     : static_cast<void *>(part + ci * weiFloats));
    memory scratch = scratchOf(p, tb.scratch);
    p.conv.execute(s, {{DNNL_ARG_SRC, a},
                       {DNNL_ARG_DIFF_DST, d},
                       {DNNL_ARG_DIFF_WEIGHTS, wm},
                       {DNNL_ARG_SCRATCHPAD, scratch}});
    s.wait();
    return true;
  });
  if (!ok || direct)
    return ok;
  // Sum the partials in chunk order (the bits depend on the shape only),
  // into the first slice, then into the user's layout.
  const int64_t floats = int64_t(full->wei.get_size() / sizeof(float));
  parallelFor(floats, 4096, [&](int64_t b, int64_t e) {
    for (int64_t ci = 1; ci < count; ++ci) {
      const float *src = part + ci * weiFloats;
      for (int64_t i = b; i < e; ++i)
        part[i] += src[i];
    }
  });
  if (full->sameWei) {
    std::copy_n(part, wsize, dw);
    return true;
  }
  try {
    return reorderFilter(*full, /*in=*/false, dw, part);
  } catch (const std::exception &) {
    return false;
  }
}

#endif // DLOPT_HAVE_DNNL

} // namespace dlopt::rt::cpu
