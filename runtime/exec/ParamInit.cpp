//===- ParamInit.cpp - Deterministic parameter initialization -------------===//

#include "runtime/exec/ParamInit.h"
#include "runtime/cpu/ThreadPool.h"

#include <cmath>
#include <numbers>

namespace dlopt::rt {

namespace {
constexpr int kMaxTruncatedAttempts = 64;

/// One standard normal from the two words 2i, 2i+1 of stream `key`.
double normalAt(uint64_t key, uint64_t i) {
  double u1 = initUniform(key, 2 * i);
  double u2 = initUniform(key, 2 * i + 1);
  // 1 - u1 is in (0, 1], so the log is finite.
  return std::sqrt(-2.0 * std::log(1.0 - u1)) *
         std::cos(2.0 * std::numbers::pi * u2);
}
} // namespace

double initUniform(uint64_t key, uint64_t n) {
  return double(initWord(key, n) >> 11) * 0x1.0p-53;
}

uint64_t initKey(uint64_t seed, uint64_t paramIndex) {
  return initWord(seed, paramIndex);
}

/// Runs fn(i) for every element, split over the CPU worker threads. Each
/// element depends only on (key, i), so the result is the same for any
/// thread count.
template <typename Fn> static void forEachElement(int64_t n, Fn fn) {
  cpu::parallelFor(n, cpu::grainFor(64), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      fn(i);
  });
}

namespace {

/// Fills a tensor of `type` whose element i is element indexOf(i) of the
/// parameter's stream.
template <typename IndexOf>
Expected<HostTensor> generate(const TensorType &type, const Init &init,
                              uint64_t seed, uint64_t paramIndex,
                              IndexOf indexOf) {
  HostTensor t;
  try {
    t = HostTensor(type);
  } catch (const std::exception &e) {
    return Status::error("cannot allocate " + type.str() + ": " + e.what());
  }
  int64_t n = t.numElements();
  uint64_t key = initKey(seed, paramIndex);
  const std::string &d = init.dist;
  if (d == "zeros")
    return t;
  if (d == "ones" || d == "constant") {
    double v = d == "ones" ? 1.0 : init.value;
    forEachElement(n, [&](int64_t i) { t.setElementFromDouble(i, v); });
    return t;
  }
  if (d == "uniform") {
    forEachElement(n, [&](int64_t i) {
      t.setElementFromDouble(i, init.low + (init.high - init.low) *
                                               initUniform(key, indexOf(i)));
    });
    return t;
  }
  if (d == "normal") {
    forEachElement(n, [&](int64_t i) {
      t.setElementFromDouble(i,
                             init.mean + init.std * normalAt(key, indexOf(i)));
    });
    return t;
  }
  if (d == "truncated_normal") {
    forEachElement(n, [&](int64_t i) {
      const uint64_t g = indexOf(i);
      double z = 0;
      for (int a = 0; a < kMaxTruncatedAttempts; ++a) {
        uint64_t k = a == 0 ? key : initWord(key, (uint64_t(1) << 32) + a);
        double c = normalAt(k, g);
        if (std::fabs(c) <= 2.0) {
          z = c;
          break;
        }
      }
      t.setElementFromDouble(i, init.mean + init.std * z);
    });
    return t;
  }
  return Status::error("unknown init distribution '" + d + "'");
}

} // namespace

Expected<HostTensor> initParam(const TensorType &type, const Init &init,
                               uint64_t seed, uint64_t paramIndex) {
  return generate(type, init, seed, paramIndex,
                  [](int64_t i) { return uint64_t(i); });
}

Expected<HostTensor> initParamBlock(const TensorType &global,
                                    const TensorType &local,
                                    const std::vector<int64_t> &start,
                                    const Init &init, uint64_t seed,
                                    uint64_t paramIndex) {
  const size_t nd = global.shape.size();
  if (local.shape.size() != nd || start.size() != nd)
    return Status::error("initParamBlock: a block of rank " +
                         std::to_string(local.shape.size()) + " of a " +
                         global.str() + " tensor");
  for (size_t d = 0; d < nd; ++d)
    if (start[d] < 0 || start[d] + local.shape[d] > global.shape[d])
      return Status::error("initParamBlock: the " + local.str() +
                           " block does not fit the " + global.str() +
                           " tensor");
  // Element i of the block is element sum_d (idx_d + start_d) * gstride_d
  // of the global tensor, idx the block index of i.
  std::vector<int64_t> gstride(nd, 1);
  for (size_t d = nd; d-- > 1;)
    gstride[d - 1] = gstride[d] * global.shape[d];
  return generate(local, init, seed, paramIndex, [&](int64_t i) {
    uint64_t g = 0;
    for (size_t d = nd; d-- > 0;) {
      const int64_t ext = local.shape[d];
      g += uint64_t((i % ext + start[d]) * gstride[d]);
      i /= ext;
    }
    return g;
  });
}

} // namespace dlopt::rt
