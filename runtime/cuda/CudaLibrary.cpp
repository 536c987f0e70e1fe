//===- CudaLibrary.cpp - dlopen()ed CUDA/cuBLAS/NCCL symbol table --------===//
#include "runtime/cuda/CudaLibrary.h"

#include <dlfcn.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>

namespace dlopt::rt::cuda {
namespace {

std::vector<std::string> searchDirs() {
  std::vector<std::string> dirs;
  for (const char *var : {"DLOPT_CUDA_LIB_DIR", "CUDA_HOME"})
    if (const char *v = std::getenv(var); v && *v)
      dirs.push_back(std::string(v) + (std::string(var) == "CUDA_HOME" ? "/lib64" : ""));
  dirs.push_back("/usr/local/cuda/lib64");
  return dirs;
}

template <typename Fn> bool loadSym(void *h, const char *name, Fn &slot) {
  slot = reinterpret_cast<Fn>(dlsym(h, name));
  return slot != nullptr;
}

std::once_flag gCoreOnce, gNcclOnce;
CudaLibrary gLib;
Status gCoreStatus, gNcclStatus;
bool gCoreLoaded = false, gNcclLoaded = false;

/// Opens one library (first soname found) and records where it came from.
Expected<void *> openRecording(const std::vector<std::string> &names,
                               std::string &path) {
  auto h = openFirstLibrary(names);
  if (!h)
    return h.status();
  path = names[0];
  char dir[4096];
  if (dlinfo(*h, RTLD_DI_ORIGIN, dir) == 0)
    path = std::string(dir);
  return h;
}

#define DLOPT_REQ(h, lname)                                                    \
  [&](const char *name, auto &slot) {                                         \
    if (!loadSym(h, name, slot))                                               \
      missing += std::string(missing.empty() ? "" : ", ") + name + " in " +    \
                 lname;                                                        \
  }
#define DLOPT_OPT(h) [&](const char *name, auto &slot) { loadSym(h, name, slot); }
#define R(name, ret, params) req(#name, lib.name);
#define O(name, ret, params) opt(#name, lib.name);

Status loadCore(CudaLibrary &lib) {
  auto rt = openRecording({"libcudart.so.13", "libcudart.so.12"}, lib.cudartPath);
  if (!rt)
    return rt.status();
  auto blas = openRecording({"libcublas.so.13", "libcublas.so.12"}, lib.cublasPath);
  if (!blas)
    return blas.status();
  auto lt = openRecording({"libcublasLt.so.13", "libcublasLt.so.12"},
                          lib.cublasLtPath);
  if (!lt)
    return lt.status();
  std::string missing;
  {
    auto req = DLOPT_REQ(*rt, "libcudart");
    auto opt = DLOPT_OPT(*rt);
    (void)opt;
    DLOPT_CUDART_SYMBOLS(R, O)
  }
  {
    auto req = DLOPT_REQ(*blas, "libcublas");
    auto opt = DLOPT_OPT(*blas);
    (void)opt;
    DLOPT_CUBLAS_SYMBOLS(R, O)
  }
  {
    auto req = DLOPT_REQ(*lt, "libcublasLt");
    auto opt = DLOPT_OPT(*lt);
    (void)opt;
    DLOPT_CUBLASLT_SYMBOLS(R, O)
  }
  if (!missing.empty())
    return Status::error("CUDA libraries lack required symbols: " + missing);
  return Status::ok();
}

Status loadNccl(CudaLibrary &lib) {
  auto h = openRecording({"libnccl.so.2"}, lib.ncclPath);
  if (!h)
    return h.status();
  std::string missing;
  auto req = DLOPT_REQ(*h, "libnccl.so.2");
  auto opt = DLOPT_OPT(*h);
  (void)opt;
  DLOPT_NCCL_SYMBOLS(R, O)
  if (!missing.empty())
    return Status::error("CUDA libraries lack required symbols: " + missing);
  return Status::ok();
}
#undef R
#undef O
#undef DLOPT_REQ
#undef DLOPT_OPT

/// The table once the core libraries are loaded (error strings), else null.
const CudaLibrary *loaded() { return gCoreLoaded ? &gLib : nullptr; }

std::string hexDigits(int v) {
  char b[16];
  std::snprintf(b, sizeof b, "%d", v);
  return b;
}

} // namespace

Expected<void *> openFirstLibrary(const std::vector<std::string> &sonames) {
  std::string tried;
  for (const auto &name : sonames) {
    std::vector<std::string> cands = {name};
    for (const auto &d : searchDirs())
      cands.push_back(d + "/" + name);
    for (const auto &c : cands) {
      if (void *h = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL))
        return h;
      const char *err = dlerror();
      if (c == name)
        tried += std::string(tried.empty() ? "" : "; ") + name +
                 " not found (dlopen: " + (err ? err : "?") + ")";
    }
  }
  return Status::error(tried + "; also searched $DLOPT_CUDA_LIB_DIR, "
                               "$CUDA_HOME/lib64, /usr/local/cuda/lib64");
}

Expected<const CudaLibrary *> loadCudaCore() {
  std::call_once(gCoreOnce, [] {
    gCoreStatus = loadCore(gLib);
    gCoreLoaded = gCoreStatus.isOk();
  });
  if (!gCoreLoaded)
    return gCoreStatus;
  return static_cast<const CudaLibrary *>(&gLib);
}

Expected<const CudaLibrary *> loadCuda() {
  auto core = loadCudaCore();
  if (!core)
    return core;
  std::call_once(gNcclOnce, [] {
    gNcclStatus = loadNccl(gLib);
    gNcclLoaded = gNcclStatus.isOk();
  });
  if (!gNcclLoaded)
    return gNcclStatus;
  return static_cast<const CudaLibrary *>(&gLib);
}

int deviceCount(std::string *reason) {
  auto lib = loadCudaCore();
  if (!lib) {
    if (reason)
      *reason = "CUDA not loadable: " + lib.status().message();
    return 0;
  }
  int n = 0;
  cudaError_t e = (*lib)->cudaGetDeviceCount(&n);
  if (e != 0) {
    if (reason)
      *reason = "cudaGetDeviceCount failed: " + cudaErrorMessage(e);
    return 0;
  }
  if (n == 0 && reason)
    *reason = "no CUDA device visible";
  return n;
}

std::string cudaErrorMessage(cudaError_t e) {
  if (const CudaLibrary *l = loaded())
    return std::string(l->cudaGetErrorName(e)) + " (" +
           l->cudaGetErrorString(e) + ")";
  switch (e) {
  case 0: return "cudaSuccess (no error)";
  case 1: return "cudaErrorInvalidValue (invalid argument)";
  case 2: return "cudaErrorMemoryAllocation (out of memory)";
  case 3: return "cudaErrorInitializationError (initialization error)";
  case 35: return "cudaErrorInsufficientDriver (CUDA driver version is insufficient for CUDA runtime version)";
  case 100: return "cudaErrorNoDevice (no CUDA-capable device is detected)";
  case 101: return "cudaErrorInvalidDevice (invalid device ordinal)";
  case 700: return "cudaErrorIllegalAddress (an illegal memory access was encountered)";
  default: return "cudaError " + hexDigits(e) + " (CUDA runtime not loaded)";
  }
}

std::string cublasStatusMessage(cublasStatus_t s) {
  if (const CudaLibrary *l = loaded())
    return std::string(l->cublasGetStatusName(s)) + " (" +
           l->cublasGetStatusString(s) + ")";
  switch (s) {
  case 0: return "CUBLAS_STATUS_SUCCESS";
  case 1: return "CUBLAS_STATUS_NOT_INITIALIZED";
  case 3: return "CUBLAS_STATUS_ALLOC_FAILED";
  case 7: return "CUBLAS_STATUS_INVALID_VALUE";
  case 8: return "CUBLAS_STATUS_ARCH_MISMATCH";
  case 11: return "CUBLAS_STATUS_MAPPING_ERROR";
  case 13: return "CUBLAS_STATUS_EXECUTION_FAILED";
  case 14: return "CUBLAS_STATUS_INTERNAL_ERROR";
  case 15: return "CUBLAS_STATUS_NOT_SUPPORTED";
  case 16: return "CUBLAS_STATUS_LICENSE_ERROR";
  default: return "cublasStatus " + hexDigits(s);
  }
}

std::string ncclResultMessage(ncclResult_t r) {
  static const char *names[] = {"ncclSuccess",       "ncclUnhandledCudaError",
                                "ncclSystemError",   "ncclInternalError",
                                "ncclInvalidArgument", "ncclInvalidUsage",
                                "ncclRemoteError",   "ncclInProgress"};
  std::string name = r >= 0 && r < 8 ? names[r] : "ncclResult " + hexDigits(r);
  if (gNcclLoaded)
    return name + " (" + gLib.ncclGetErrorString(r) + ")";
  return name;
}

static std::string where(const char *expr, const char *file, int line) {
  return std::string(expr) + " failed at " + file + ":" + std::to_string(line) +
         ": ";
}

Status cudaFailure(cudaError_t e, const char *expr, const char *file, int line) {
  return Status::error(where(expr, file, line) + cudaErrorMessage(e));
}
Status cublasFailure(cublasStatus_t s, const char *expr, const char *file,
                     int line) {
  return Status::error(where(expr, file, line) + cublasStatusMessage(s));
}
Status ncclFailure(ncclResult_t r, const char *expr, const char *file,
                   int line) {
  std::string msg = where(expr, file, line) + ncclResultMessage(r);
  if (gNcclLoaded && gLib.ncclGetLastError)
    if (const char *last = gLib.ncclGetLastError(nullptr); last && *last)
      msg += ": " + std::string(last);
  return Status::error(msg);
}

std::string uniqueIdToHex(const ncclUniqueId &id) {
  static const char *digits = "0123456789abcdef";
  std::string s;
  s.reserve(2 * kNcclUniqueIdBytes);
  for (int i = 0; i < kNcclUniqueIdBytes; ++i) {
    auto b = static_cast<unsigned char>(id.internal[i]);
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

Expected<ncclUniqueId> uniqueIdFromHex(std::string_view hex) {
  while (!hex.empty() && (hex.back() == '\n' || hex.back() == '\r' || hex.back() == ' '))
    hex.remove_suffix(1);
  if (hex.size() != 2 * kNcclUniqueIdBytes)
    return Status::error("NCCL unique id: expected " +
                         std::to_string(2 * kNcclUniqueIdBytes) +
                         " hex digits, got " + std::to_string(hex.size()));
  auto val = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  ncclUniqueId id{};
  for (int i = 0; i < kNcclUniqueIdBytes; ++i) {
    int hi = val(hex[2 * i]), lo = val(hex[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return Status::error("NCCL unique id: non-hex digit at position " +
                           std::to_string(hi < 0 ? 2 * i : 2 * i + 1));
    id.internal[i] = static_cast<char>((hi << 4) | lo);
  }
  return id;
}

Expected<ncclUniqueId> uniqueIdFromEnv(const char *var) {
  const char *v = std::getenv(var);
  if (!v || !*v)
    return Status::error(std::string(var) +
                         " is not set (rank 0 creates the NCCL id and the "
                         "launcher passes it to every rank)");
  auto id = uniqueIdFromHex(v);
  if (!id)
    return id.status().withContext(std::string(var) + ": ");
  return id;
}

Status writeUniqueIdFile(const std::string &path, const ncclUniqueId &id) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << uniqueIdToHex(id) << "\n";
    if (!f)
      return Status::error("cannot write " + tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec)
    return Status::error("cannot rename " + tmp + " to " + path + ": " +
                         ec.message());
  return Status::ok();
}

Expected<ncclUniqueId> readUniqueIdFile(const std::string &path) {
  std::ifstream f(path);
  if (!f)
    return Status::error("cannot open NCCL id file " + path);
  std::string line;
  std::getline(f, line);
  auto id = uniqueIdFromHex(line);
  if (!id)
    return id.status().withContext(path + ": ");
  return id;
}

Expected<LaunchInfo> launchInfoFromEnv() {
  struct Pair { const char *rank, *size, *local; };
  const Pair pairs[] = {
      {"DLOPT_RANK", "DLOPT_WORLD_SIZE", "DLOPT_LOCAL_RANK"},
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
      {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
      {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"}};
  auto parse = [](const char *var, const char *v, int &out) -> Status {
    char *end = nullptr;
    errno = 0;
    long x = std::strtol(v, &end, 10);
    if (!*v || *end || errno || x < 0 || x > 1 << 30)
      return Status::error(std::string(var) + "=\"" + v +
                           "\" is not a non-negative integer");
    out = int(x);
    return Status::ok();
  };
  std::vector<LaunchInfo> found;
  for (const Pair &p : pairs) {
    const char *r = std::getenv(p.rank), *s = std::getenv(p.size);
    if (!r && !s)
      continue;
    if (!r || !s)
      return Status::error(std::string(r ? p.rank : p.size) + " is set but " +
                           (r ? p.size : p.rank) + " is not");
    LaunchInfo li;
    li.source = std::string(p.rank) + "/" + p.size;
    DLOPT_RETURN_IF_ERROR(parse(p.rank, r, li.rank));
    DLOPT_RETURN_IF_ERROR(parse(p.size, s, li.worldSize));
    if (li.worldSize < 1 || li.rank >= li.worldSize)
      return Status::error(li.source + ": rank " + std::to_string(li.rank) +
                           " is outside world size " +
                           std::to_string(li.worldSize));
    if (const char *l = std::getenv(p.local))
      DLOPT_RETURN_IF_ERROR(parse(p.local, l, li.localRank));
    found.push_back(li);
  }
  if (found.empty())
    return Status::error("no launcher environment: set DLOPT_RANK and "
                         "DLOPT_WORLD_SIZE, or start under mpirun/srun "
                         "(OMPI_COMM_WORLD_*, PMI_*, SLURM_PROCID/NTASKS)");
  // DLOPT_* is an explicit override; launcher pairs must agree otherwise.
  if (found[0].source.rfind("DLOPT_", 0) != 0)
    for (size_t i = 1; i < found.size(); ++i)
      if (found[i].rank != found[0].rank ||
          found[i].worldSize != found[0].worldSize)
        return Status::error(
            "inconsistent launcher environment: " + found[0].source + " says " +
            std::to_string(found[0].rank) + "/" +
            std::to_string(found[0].worldSize) + " but " + found[i].source +
            " says " + std::to_string(found[i].rank) + "/" +
            std::to_string(found[i].worldSize));
  return found[0];
}

} // namespace dlopt::rt::cuda
