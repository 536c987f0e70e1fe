//===- CpuBackend.cpp - Runs instructions on the host with dlopt_cpu ------===//

#include "runtime/exec/CpuBackend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace dlopt::rt {

namespace {
constexpr int64_t kArenaAlignment = 64;

Status rangeError(const char *what, int64_t offset, int64_t bytes,
                  int64_t size) {
  return Status::error(std::string(what) + ": bytes [" +
                       std::to_string(offset) + ", " +
                       std::to_string(offset + bytes) +
                       ") are outside the arena of " + std::to_string(size) +
                       " bytes");
}

bool inRange(int64_t offset, int64_t bytes, int64_t size) {
  return offset >= 0 && bytes >= 0 && offset <= size && bytes <= size - offset;
}
} // namespace

class CpuBackend::Arena final : public DeviceArena {
public:
  Arena(CpuBackend &owner, int rank, void *data, int64_t size,
        int64_t allocated)
      : owner_(owner), rank_(rank), data_(data), size_(size),
        allocated_(allocated) {}
  ~Arena() override {
    std::free(data_);
    owner_.noteFreed(allocated_);
  }
  void *data() const override { return data_; }
  int64_t size() const override { return size_; }
  int rank() const override { return rank_; }

private:
  CpuBackend &owner_;
  int rank_;
  void *data_;
  int64_t size_;
  int64_t allocated_;
};

CpuBackend::CpuBackend(const BackendOptions &opts) {
  cpu::useSerialBlas();
  if (opts.threads > 0)
    cpu::setNumThreads(opts.threads);
}

bool CpuBackend::supportsOp(const std::string &op) const {
  return cpu::hasKernel(op) || isCommunicationOp(op);
}

Expected<std::unique_ptr<DeviceArena>>
CpuBackend::allocateArena(int rank, int64_t bytes) {
  if (bytes < 0)
    return Status::error("cannot allocate a negative arena size");
  // aligned_alloc needs a multiple of the alignment, and a non-zero size so
  // even an empty arena has a distinct valid address.
  int64_t rounded =
      std::max<int64_t>(kArenaAlignment,
                        (bytes + kArenaAlignment - 1) / kArenaAlignment *
                            kArenaAlignment);
  void *p = std::aligned_alloc(kArenaAlignment, size_t(rounded));
  if (!p)
    return Status::error("cannot allocate the arena of rank " +
                         std::to_string(rank) + ": " +
                         formatBytes(bytes) + " (" + std::to_string(bytes) +
                         " bytes) of host memory");
  noteAllocated(rounded);
  return std::unique_ptr<DeviceArena>(
      new Arena(*this, rank, p, bytes, rounded));
}

Status CpuBackend::copyToDevice(DeviceArena &arena, int64_t offset,
                                const void *src, int64_t bytes) {
  if (!inRange(offset, bytes, arena.size()))
    return rangeError("copy to device", offset, bytes, arena.size());
  if (bytes)
    std::memcpy(static_cast<uint8_t *>(arena.data()) + offset, src,
                size_t(bytes));
  return Status::ok();
}

const void *CpuBackend::hostView(const DeviceArena &arena, int64_t offset,
                                 int64_t bytes) const {
  if (!inRange(offset, bytes, arena.size()))
    return nullptr;
  return static_cast<const uint8_t *>(arena.data()) + offset;
}

Status CpuBackend::copyToHost(void *dst, const DeviceArena &arena,
                              int64_t offset, int64_t bytes) {
  if (!inRange(offset, bytes, arena.size()))
    return rangeError("copy to host", offset, bytes, arena.size());
  if (bytes)
    std::memcpy(dst, static_cast<const uint8_t *>(arena.data()) + offset,
                size_t(bytes));
  return Status::ok();
}

Status CpuBackend::copyOnDevice(DeviceArena &arena, int64_t dstOffset,
                                int64_t srcOffset, int64_t bytes) {
  if (!inRange(dstOffset, bytes, arena.size()))
    return rangeError("copy on device (destination)", dstOffset, bytes,
                      arena.size());
  if (!inRange(srcOffset, bytes, arena.size()))
    return rangeError("copy on device (source)", srcOffset, bytes,
                      arena.size());
  auto *base = static_cast<uint8_t *>(arena.data());
  if (bytes)
    std::memmove(base + dstOffset, base + srcOffset, size_t(bytes));
  return Status::ok();
}

/// Runs a communication instruction over the rank's communicator of the
/// instruction's group (host buffers).
Status runCommunication(const Instr &instr, std::span<const TensorRef> ins,
                        std::span<const TensorRef> outs,
                        const RunContext &ctx);

Status CpuBackend::run(const Instr &instr, std::span<const TensorRef> ins,
                       std::span<const TensorRef> outs,
                       const RunContext &ctx) {
  if (isCommunicationOp(instr.op))
    return runCommunication(instr, ins, outs, ctx);
  return cpu::runKernel(instr, ins, outs);
}

Status runCommunication(const Instr &instr, std::span<const TensorRef> ins,
                        std::span<const TensorRef> outs,
                        const RunContext &ctx) {
  // The shapes were checked against the group when the executable was
  // loaded (Executable::validate).
  std::string where = "'" + instr.op + "'" +
                      (instr.loc.empty() ? "" : " at " + instr.loc) + ": ";
  int64_t group = instr.getInt("group", -1);
  if (group < 0 || size_t(group) >= ctx.groups.size() || !ctx.groups[group])
    return Status::error(where + "no communicator for group " +
                         std::to_string(group) + " on rank " +
                         std::to_string(ctx.rank));
  Communicator &comm = *ctx.groups[size_t(group)];
  if (instr.op == "send_recv") {
    // Sends are posted first, then the receives: the in-process
    // communicator buffers sends, so a batch never waits on itself.
    Expected<std::vector<int64_t>> sendPeers = instr.getInts("send_peers");
    Expected<std::vector<int64_t>> recvPeers = instr.getInts("recv_peers");
    if (!sendPeers || !recvPeers)
      return Status::error(where + (!sendPeers ? sendPeers.status().message()
                                               : recvPeers.status().message()));
    for (size_t i = 0; i < ins.size(); ++i)
      DLOPT_RETURN_IF_ERROR(
          comm.send(hostIn(ins[i].data, ins[i].numElements(), ins[i].type.dtype),
                    int((*sendPeers)[i]))
              .withContext(where));
    for (size_t i = 0; i < outs.size(); ++i)
      DLOPT_RETURN_IF_ERROR(
          comm.recv(hostOut(outs[i].data, outs[i].numElements(),
                            outs[i].type.dtype),
                    int((*recvPeers)[i]))
              .withContext(where));
    return Status::ok();
  }
  if (instr.op == "send" || instr.op == "recv") {
    int peer = int(instr.getInt("peer", -1));
    Status st = instr.op == "send"
                    ? comm.send(hostIn(ins[0].data, ins[0].numElements(),
                                       ins[0].type.dtype),
                                peer)
                    : comm.recv(hostOut(outs[0].data, outs[0].numElements(),
                                        outs[0].type.dtype),
                                peer);
    return st.withContext(where);
  }
  const TensorRef &x = ins[0], &y = outs[0];
  CommInput in = hostIn(x.data, x.numElements(), x.type.dtype);
  CommOutput out = hostOut(y.data, y.numElements(), y.type.dtype);
  auto reduceOp = [&]() {
    std::string r = instr.getString("reduce").isOk()
                        ? *instr.getString("reduce")
                        : std::string("sum");
    return r == "max"   ? ReduceOp::Max
           : r == "min" ? ReduceOp::Min
           : r == "avg" ? ReduceOp::Avg
                        : ReduceOp::Sum;
  };
  // Collectives gather and scatter along dim 0 of a flat buffer; along
  // another dim the blocks are moved through a contiguous staging buffer.
  auto outer = [](const TensorType &t, int64_t axis) {
    int64_t n = 1;
    for (int64_t d = 0; d < axis; ++d)
      n *= t.shape[size_t(d)];
    return n;
  };
  const int64_t elem = dtypeSize(x.type.dtype);
  const int64_t n = comm.size();
  Status st;
  if (instr.op == "all_reduce") {
    st = comm.allReduce(in, out, reduceOp());
  } else if (instr.op == "broadcast") {
    if (y.data != x.data)
      std::memcpy(y.data, x.data, size_t(x.numElements() * elem));
    st = comm.broadcast(out, int(instr.getInt("root", 0)));
  } else if (instr.op == "all_gather") {
    int64_t axis = instr.getInt("axis", 0);
    int64_t rows = outer(x.type, axis);
    if (rows == 1) {
      st = comm.allGather(in, out);
    } else {
      // Gathered blocks arrive rank-major; interleave them into dim `axis`.
      std::vector<uint8_t> staged(size_t(y.numElements() * elem));
      st = comm.allGather(in, hostOut(staged.data(), y.numElements(),
                                      y.type.dtype));
      int64_t chunk = x.numElements() / rows * elem; // one row of x
      for (int64_t r = 0; r < n && st; ++r)
        for (int64_t i = 0; i < rows; ++i)
          std::memcpy(static_cast<uint8_t *>(y.data) + (i * n + r) * chunk,
                      staged.data() + (r * rows + i) * chunk, size_t(chunk));
    }
  } else if (instr.op == "reduce_scatter") {
    int64_t axis = instr.getInt("axis", 0);
    int64_t rows = outer(x.type, axis);
    if (rows == 1) {
      st = comm.reduceScatter(in, out, reduceOp());
    } else {
      // Make each destination rank's blocks contiguous first.
      std::vector<uint8_t> staged(size_t(x.numElements() * elem));
      int64_t chunk = y.numElements() / rows * elem; // one row of y
      for (int64_t r = 0; r < n; ++r)
        for (int64_t i = 0; i < rows; ++i)
          std::memcpy(staged.data() + (r * rows + i) * chunk,
                      static_cast<const uint8_t *>(x.data) + (i * n + r) * chunk,
                      size_t(chunk));
      st = comm.reduceScatter(
          hostIn(staged.data(), x.numElements(), x.type.dtype), out,
          reduceOp());
    }
  } else if (instr.op == "all_slice") {
    // No traffic: this rank's block (its index in the group) along `axis`.
    int64_t axis = instr.getInt("axis", 0);
    int64_t rows = outer(x.type, axis);
    int64_t chunk = y.numElements() / rows * elem; // one row of y
    int64_t r = comm.rank();
    for (int64_t i = 0; i < rows; ++i)
      std::memcpy(static_cast<uint8_t *>(y.data) + i * chunk,
                  static_cast<const uint8_t *>(x.data) + (i * n + r) * chunk,
                  size_t(chunk));
  } else if (instr.op == "all_to_all") {
    int64_t split = instr.getInt("split_axis", 0);
    int64_t concat = instr.getInt("concat_axis", 0);
    // Send block r (the r-th slice of `split`) to rank r; received block r
    // becomes the r-th slice of `concat`.
    const TensorType &xt = x.type;
    int64_t so = outer(xt, split), sIn = xt.shape[size_t(split)];
    int64_t sInner = x.numElements() / so / sIn * elem;
    int64_t blockElems = x.numElements() / n;
    std::vector<uint8_t> send(size_t(x.numElements() * elem)),
        recv(size_t(y.numElements() * elem));
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < so; ++i)
        std::memcpy(send.data() + r * blockElems * elem +
                        i * (sIn / n) * sInner,
                    static_cast<const uint8_t *>(x.data) +
                        (i * sIn + r * (sIn / n)) * sInner,
                    size_t((sIn / n) * sInner));
    st = comm.allToAll(hostIn(send.data(), x.numElements(), xt.dtype),
                       hostOut(recv.data(), y.numElements(), y.type.dtype));
    // Each received block has x's shape with dim `split` divided by n.
    TensorType bt = xt;
    bt.shape[size_t(split)] /= n;
    int64_t co = outer(bt, concat), cIn = bt.shape[size_t(concat)];
    int64_t cInner = blockElems / co / cIn * elem;
    for (int64_t r = 0; r < n && st; ++r)
      for (int64_t i = 0; i < co; ++i)
        std::memcpy(static_cast<uint8_t *>(y.data) +
                        (i * cIn * n + r * cIn) * cInner,
                    recv.data() + r * blockElems * elem + i * cIn * cInner,
                    size_t(cIn * cInner));
  } else {
    return Status::error(where + "unknown communication op");
  }
  return st.withContext(where);
}

} // namespace dlopt::rt
