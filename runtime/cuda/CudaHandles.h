//===- CudaHandles.h - Move-only owners of CUDA and cuBLASLt handles -------===//
//
// Every device buffer, stream, event and cuBLASLt handle the runtime creates
// is held by one of these: move-only, released in a noexcept destructor
// through the symbol table it was created with (runtime/cuda/CudaLibrary.h).
// Destructors ignore release errors (nothing useful can be done with them
// while unwinding); the creating functions return a Status.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/cuda/CudaLibrary.h"

#include <utility>

namespace dlopt::rt::cuda {

/// Shared move/destroy plumbing: `Traits::destroy(lib, handle)`.
template <typename H, typename Traits> class UniqueHandle {
public:
  UniqueHandle() = default;
  UniqueHandle(const CudaLibrary *lib, H h) : lib_(lib), h_(h) {}
  UniqueHandle(UniqueHandle &&o) noexcept
      : lib_(o.lib_), h_(std::exchange(o.h_, H{})) {}
  UniqueHandle &operator=(UniqueHandle &&o) noexcept {
    if (this != &o) {
      reset();
      lib_ = o.lib_;
      h_ = std::exchange(o.h_, H{});
    }
    return *this;
  }
  UniqueHandle(const UniqueHandle &) = delete;
  UniqueHandle &operator=(const UniqueHandle &) = delete;
  ~UniqueHandle() { reset(); }

  H get() const { return h_; }
  explicit operator bool() const { return h_ != H{}; }
  void reset() noexcept {
    if (h_ != H{} && lib_)
      Traits::destroy(*lib_, h_);
    h_ = H{};
  }

private:
  const CudaLibrary *lib_ = nullptr;
  H h_{};
};

struct StreamTraits {
  static void destroy(const CudaLibrary &l, cudaStream_t s) noexcept {
    (void)l.cudaStreamDestroy(s);
  }
};
struct EventTraits {
  static void destroy(const CudaLibrary &l, cudaEvent_t e) noexcept {
    (void)l.cudaEventDestroy(e);
  }
};
struct CublasLtTraits {
  static void destroy(const CudaLibrary &l, cublasLtHandle_t h) noexcept {
    (void)l.cublasLtDestroy(h);
  }
};
struct GraphExecTraits {
  static void destroy(const CudaLibrary &l, cudaGraphExec_t g) noexcept {
    if (l.cudaGraphExecDestroy)
      (void)l.cudaGraphExecDestroy(g);
  }
};

using Stream = UniqueHandle<cudaStream_t, StreamTraits>;
using Event = UniqueHandle<cudaEvent_t, EventTraits>;
using CublasLtHandle = UniqueHandle<cublasLtHandle_t, CublasLtTraits>;
using GraphExec = UniqueHandle<cudaGraphExec_t, GraphExecTraits>;

/// How a CudaAllocation allocates and frees: device memory (cudaMalloc)
/// or page-locked host memory (cudaMallocHost), which the device copies to
/// and from asynchronously.
struct DeviceMemory {
  static constexpr const char *kAlloc = "cudaMalloc";
  static cudaError_t alloc(const CudaLibrary &lib, void **p, size_t n) {
    return lib.cudaMalloc(p, n);
  }
  static void free(const CudaLibrary &lib, void *p) { (void)lib.cudaFree(p); }
};
struct PinnedHostMemory {
  static constexpr const char *kAlloc = "cudaMallocHost";
  static cudaError_t alloc(const CudaLibrary &lib, void **p, size_t n) {
    return lib.cudaMallocHost(p, n);
  }
  static void free(const CudaLibrary &lib, void *p) {
    (void)lib.cudaFreeHost(p);
  }
};

/// One allocation of `bytes()` bytes, freed when destroyed or reset.
template <typename Memory> class CudaAllocation {
public:
  CudaAllocation() = default;
  CudaAllocation(CudaAllocation &&o) noexcept
      : lib_(o.lib_), p_(std::exchange(o.p_, nullptr)),
        bytes_(std::exchange(o.bytes_, 0)) {}
  CudaAllocation &operator=(CudaAllocation &&o) noexcept {
    if (this != &o) {
      reset();
      lib_ = o.lib_;
      p_ = std::exchange(o.p_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  CudaAllocation(const CudaAllocation &) = delete;
  CudaAllocation &operator=(const CudaAllocation &) = delete;
  ~CudaAllocation() { reset(); }

  /// Allocates (on the current device for device memory); the error names
  /// the call and the size.
  static Expected<CudaAllocation> allocate(const CudaLibrary &lib,
                                           int64_t bytes) {
    CudaAllocation b;
    b.lib_ = &lib;
    void *p = nullptr;
    cudaError_t e = Memory::alloc(lib, &p, size_t(bytes > 0 ? bytes : 1));
    if (e != 0) {
      (void)lib.cudaGetLastError(); // clear the sticky-free error state
      return Status::error(std::string(Memory::kAlloc) + " of " +
                           std::to_string(bytes) +
                           " bytes failed: " + cudaErrorMessage(e));
    }
    b.p_ = p;
    b.bytes_ = bytes;
    return b;
  }

  void *get() const { return p_; }
  int64_t bytes() const { return bytes_; }
  void reset() noexcept {
    if (p_ && lib_)
      Memory::free(*lib_, p_);
    p_ = nullptr;
    bytes_ = 0;
  }

private:
  const CudaLibrary *lib_ = nullptr;
  void *p_ = nullptr;
  int64_t bytes_ = 0;
};

using DeviceBuffer = CudaAllocation<DeviceMemory>;
using PinnedBuffer = CudaAllocation<PinnedHostMemory>;

inline Expected<Stream> createStream(const CudaLibrary &lib) {
  cudaStream_t s = nullptr;
  DLOPT_CUDA_CHECK(lib.cudaStreamCreateWithFlags(&s, kCudaStreamNonBlocking));
  return Stream(&lib, s);
}

/// An event for ordering streams; `timing` ones also record a timestamp
/// (cudaEventElapsedTime), at a small cost per record.
inline Expected<Event> createEvent(const CudaLibrary &lib, bool timing = false) {
  cudaEvent_t e = nullptr;
  DLOPT_CUDA_CHECK(lib.cudaEventCreateWithFlags(
      &e, timing ? 0u : kCudaEventDisableTiming));
  return Event(&lib, e);
}

} // namespace dlopt::rt::cuda
