//===- ParamInit.h - Deterministic parameter initialization ---------------===//
//
// Parameters without a bound value are filled from their Init with a
// counter-based generator, so element i of parameter p depends only on
// (seed, p, i): the result is the same on every backend, for every thread
// count, and for any sharding of the parameter (a shard can generate its own
// elements by global index). The exact scheme (docs/dlopt-run.md):
//
//   mix(z)     = z ^= z >> 30; z *= 0xBF58476D1CE4E5B9;
//                z ^= z >> 27; z *= 0x94D049BB133111EB; z ^ (z >> 31)
//   word(k, n) = mix(k + (n + 1) * 0x9E3779B97F4A7C15)        (uint64, wraps)
//   u(k, n)    = (word(k, n) >> 11) * 2^-53                    in [0, 1)
//   key(s, p)  = word(s, p)             p = index in Executable::params
//   uniform    : x_i = low + (high - low) * u(key, i)
//   normal     : z_i = sqrt(-2 ln(1 - u(key, 2i))) * cos(2 pi u(key, 2i+1)),
//                x_i = mean + std * z_i
//   truncated  : attempt a = 0, 1, ... draws z_i as above with key
//                word(key, 2^32 + a) for a > 0, until |z_i| <= 2
//                (after 64 failed attempts z_i = 0); x_i = mean + std * z_i
//
// Values are computed in double and stored as a cast to the element type.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/exec/HostTensor.h"

#include <cstdint>
#include <vector>

namespace dlopt::rt {

/// The generator's building blocks, exposed for tests and documentation
/// (inline: the synthetic data loader draws one word per element).
inline uint64_t initMix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
/// Word n of stream `key` (splitmix64).
inline uint64_t initWord(uint64_t key, uint64_t n) {
  return initMix(key + (n + 1) * 0x9E3779B97F4A7C15ull);
}
double initUniform(uint64_t key, uint64_t n);
/// Stream key of the parameter at position `paramIndex` in
/// Executable::params under `seed`.
uint64_t initKey(uint64_t seed, uint64_t paramIndex);

/// Generates the initial value of a parameter. Fails on an unknown
/// distribution.
Expected<HostTensor> initParam(const TensorType &type, const Init &init,
                               uint64_t seed, uint64_t paramIndex);

/// The block of `local` type at `start` of the parameter of `global` type,
/// generating only its elements (by global index): equal to cutting the
/// block out of initParam(global, ...), at the block's cost. A rank of a
/// tp=8 plan of a large model initializes its eighth, not the whole.
Expected<HostTensor> initParamBlock(const TensorType &global,
                                    const TensorType &local,
                                    const std::vector<int64_t> &start,
                                    const Init &init, uint64_t seed,
                                    uint64_t paramIndex);

} // namespace dlopt::rt
