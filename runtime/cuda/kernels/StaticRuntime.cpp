//===- StaticRuntime.cpp - The CUDA runtime the kernels are linked with ---===//
//
// Kernels launched with <<<>>> go through the CUDA runtime nvcc links them
// with (cudart_static). The backend must allocate, copy and synchronize with
// that same runtime, not with a second copy dlopen()ed from libcudart.so, so
// runtimeTable() returns the loadCudaCore() table (cuBLAS(Lt) entries) with
// every CUDA runtime entry pointed at a thin adapter over the static
// runtime. Adapters convert between the opaque types of CudaLibrary.h and
// the real ones (same ABI: pointers stay pointers, enums are ints).
//
//===----------------------------------------------------------------------===//

#include "runtime/cuda/CudaKernels.h"
#include "runtime/cuda/CudaLibrary.h"

#include <cuda_runtime_api.h>

#include <mutex>
#include <string>
#include <type_traits>

namespace dlopt::rt::cuda::kernels {
namespace {

template <typename To, typename From> To convert(From f) {
  if constexpr (std::is_pointer_v<To> && std::is_pointer_v<From>)
    return reinterpret_cast<To>(f);
  else
    return static_cast<To>(f);
}

template <typename Field, typename Real, Real Fn> struct Adapter;
template <typename R, typename... A, typename RR, typename... RA,
          RR (*Fn)(RA...)>
struct Adapter<R (*)(A...), RR (*)(RA...), Fn> {
  static_assert(sizeof...(A) == sizeof...(RA), "parameter count differs");
  static R call(A... a) { return convert<R>(Fn(convert<RA>(a)...)); }
};

std::once_flag gOnce;
CudaLibrary gTable;
std::string gError;
bool gOk = false;

} // namespace

bool built() { return true; }

const char *buildDescription() {
#ifdef DLOPT_CUDA_BUILD_DESC
  return DLOPT_CUDA_BUILD_DESC;
#else
  return "CUDA";
#endif
}

const CudaLibrary *runtimeTable(const char **error) {
  std::call_once(gOnce, [] {
    auto core = loadCudaCore();
    if (!core) {
      gError = core.status().message();
      return;
    }
    gTable = **core;
#define DLOPT_ADAPT(name, ret, params)                                         \
  gTable.name = &Adapter<decltype(gTable.name), decltype(&::name), &::name>::call;
    DLOPT_CUDART_SYMBOLS(DLOPT_ADAPT, DLOPT_ADAPT)
#undef DLOPT_ADAPT
    gTable.cudartPath = std::string("statically linked (") +
                        buildDescription() + ")";
    gOk = true;
  });
  if (!gOk) {
    if (error)
      *error = gError.c_str();
    return nullptr;
  }
  return &gTable;
}

} // namespace dlopt::rt::cuda::kernels
