//===- RankOrderReduce.cpp - Reductions in rank order ---------------------===//

#include "runtime/comm/RankOrderReduce.h"
#include "runtime/cpu/Half.h"

#include <cstring>

namespace dlopt::rt {
namespace {

template <typename T> T loadAt(const void *p, int64_t i) {
  T v;
  std::memcpy(&v, static_cast<const uint8_t *>(p) + i * int64_t(sizeof(T)),
              sizeof(T));
  return v;
}
template <typename T> void storeAt(void *p, int64_t i, T v) {
  std::memcpy(static_cast<uint8_t *>(p) + i * int64_t(sizeof(T)), &v,
              sizeof(T));
}

/// Reduces elements [off, off+cnt) of every input, in rank order, into dst
/// (element 0 of dst is element `off`).
template <typename Acc, typename Load, typename Add, typename Finish>
void reduceElems(const std::vector<const void *> &ins, int64_t off,
                 int64_t cnt, ReduceOp op, Load load, Add add,
                 Finish finish) {
  for (int64_t i = 0; i < cnt; ++i) {
    Acc acc = load(ins[0], off + i);
    for (size_t q = 1; q < ins.size(); ++q) {
      Acc x = load(ins[q], off + i);
      switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg:
        acc = add(acc, x);
        break;
      case ReduceOp::Max: // NaN propagates: x != x only for NaN
        if (x > acc || x != x)
          acc = x;
        break;
      case ReduceOp::Min:
        if (x < acc || x != x)
          acc = x;
        break;
      }
    }
    finish(i, acc);
  }
}

} // namespace

void reduceInto(const std::vector<const void *> &ins, int64_t off,
                int64_t cnt, DType t, ReduceOp op, void *dst) {
  if (t == DType::F32 && op == ReduceOp::Sum && !ins.empty()) {
    // The common case, in blocks that vectorize: the same additions in the
    // same order as the general loop below.
    float *d = static_cast<float *>(dst);
    std::memcpy(d, static_cast<const float *>(ins[0]) + off,
                size_t(cnt) * sizeof(float));
    for (size_t q = 1; q < ins.size(); ++q) {
      const float *p = static_cast<const float *>(ins[q]) + off;
      for (int64_t i = 0; i < cnt; ++i)
        d[i] += p[i];
    }
    return;
  }
  const bool avg = op == ReduceOp::Avg;
  const auto n = int64_t(ins.size());
  auto fadd = [](float a, float b) { return a + b; };
  switch (t) {
  case DType::F32:
    reduceElems<float>(
        ins, off, cnt, op, loadAt<float>, fadd, [&](int64_t i, float a) {
          storeAt<float>(dst, i, avg ? a / float(n) : a);
        });
    break;
  case DType::F16:
    reduceElems<float>(
        ins, off, cnt, op,
        [](const void *p, int64_t i) {
          return halfToFloat(loadAt<uint16_t>(p, i));
        },
        fadd, [&](int64_t i, float a) {
          storeAt<uint16_t>(dst, i, floatToHalf(avg ? a / float(n) : a));
        });
    break;
  case DType::BF16:
    reduceElems<float>(
        ins, off, cnt, op,
        [](const void *p, int64_t i) {
          return bf16ToFloat(loadAt<uint16_t>(p, i));
        },
        fadd, [&](int64_t i, float a) {
          storeAt<uint16_t>(dst, i, floatToBf16(avg ? a / float(n) : a));
        });
    break;
  case DType::I32:
    // Accumulate in i64 (exact for any group size), then wrap to i32.
    reduceElems<int64_t>(
        ins, off, cnt, op,
        [](const void *p, int64_t i) { return int64_t(loadAt<int32_t>(p, i)); },
        [](int64_t a, int64_t b) { return a + b; },
        [&](int64_t i, int64_t a) {
          storeAt<int32_t>(dst, i, int32_t(uint32_t(avg ? a / n : a)));
        });
    break;
  case DType::I64:
    reduceElems<int64_t>(
        ins, off, cnt, op, loadAt<int64_t>,
        [](int64_t a, int64_t b) {
          return int64_t(uint64_t(a) + uint64_t(b)); // wraps, no UB
        },
        [&](int64_t i, int64_t a) { storeAt<int64_t>(dst, i, avg ? a / n : a); });
    break;
  case DType::I1:
    break; // rejected before the rendezvous
  }
}


} // namespace dlopt::rt
