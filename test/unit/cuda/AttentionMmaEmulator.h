//===- AttentionMmaEmulator.h - A CUDA block on the host, for fa:: ---------===//
//
// Runs runtime/cuda/kernels/AttentionMma.cuh's kernels on the host: 128
// fibers (ucontext) per block with block and warp barriers, shuffles, and
// the warp-collective mma.sync.m16n8k16.row.col (bf16/f16, f32
// accumulation), ldmatrix.x4.trans and 32-bit shared loads implemented from
// the PTX ISA's fragment definitions, independently of the kernels. Each
// collective asserts that every matrix element is covered exactly once, and
// every shared access is bounds- and alignment-checked; shared memory starts
// as NaN bytes so a read before a write shows. Bank conflicts are counted.
// It proves the kernels' index math (fragment layouts, masking, tails,
// barriers), not the hardware's rounding order or speed.
//
//===----------------------------------------------------------------------===//
#pragma once
#include "runtime/cuda/CudaKernels.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <type_traits>
#include <ucontext.h>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __trap() abort()

struct Dim3 { unsigned x = 0, y = 0, z = 0; };
struct uint4 { uint32_t x, y, z, w; };
inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return {a, b, c, d}; }

namespace dlopt::rt::cuda::kernels {
struct F16 { uint16_t bits; };
struct BF16 { uint16_t bits; };
inline float toF(float x) { return x; }
inline float toF(F16 x) { _Float16 h; memcpy(&h, &x.bits, 2); return float(h); }
inline float toF(BF16 x) { uint32_t u = uint32_t(x.bits) << 16; float f; memcpy(&f, &u, 4); return f; }
template <typename T> T fromF(float x);
template <> inline F16 fromF<F16>(float x) { _Float16 h = (_Float16)x; F16 r; memcpy(&r.bits, &h, 2); return r; }
template <> inline BF16 fromF<BF16>(float x) {
  uint32_t u; memcpy(&u, &x, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return BF16{uint16_t((u >> 16) | 0x0040u)};
  u += 0x7FFFu + ((u >> 16) & 1u);
  return BF16{uint16_t(u >> 16)};
}
inline int64_t loadId(const void *p, bool is64, int64_t i) {
  return is64 ? static_cast<const int64_t *>(p)[i] : int64_t(static_cast<const int32_t *>(p)[i]);
}
} // namespace dlopt::rt::cuda::kernels

namespace emu {
constexpr int NT = 128;
struct Fiber { ucontext_t ctx; bool done = false; Dim3 tid; std::vector<char> stack; };
inline ucontext_t mainCtx;
inline Fiber *fibers[NT];
inline int cur = 0;
inline Dim3 blockIdxV, blockDimV{NT, 1, 1};
inline unsigned char *smemBase = nullptr;
inline size_t smemSize = 0;
inline std::function<void()> body;
inline int blockCount = 0, blockGen = 0;
struct Warp {
  int count = 0, gen = 0;
  uint32_t a[32][4], b[32][2]; float c[32][4];
  const void *addr[32]; float f[32];
};
inline Warp warps[NT / 32];
inline int maxLd32Conflict = 0, maxLdmConflict = 0;
inline long ld32Count = 0, ldmCount = 0, mmaCount = 0;

inline void yield() { swapcontext(&fibers[cur]->ctx, &mainCtx); }
inline int lane() { return cur % 32; }
inline Warp &warp() { return warps[cur / 32]; }
inline void warpBarrier() {
  Warp &w = warp(); int g = w.gen;
  if (++w.count == 32) { w.count = 0; ++w.gen; } else while (w.gen == g) yield();
}
inline void syncthreads() {
  int g = blockGen;
  if (++blockCount == NT) { blockCount = 0; ++blockGen; } else while (blockGen == g) yield();
}
inline unsigned char *smem() { return smemBase; }
inline void checkSmem(const void *p, size_t bytes, size_t align) {
  auto u = reinterpret_cast<uintptr_t>(p), base = reinterpret_cast<uintptr_t>(smemBase);
  if (u < base || u + bytes > base + smemSize || (u - base) % align) {
    fprintf(stderr, "bad shared access off=%ld bytes=%zu align=%zu\n", long(u - base), bytes, align);
    abort();
  }
}
template <typename T> float cvt(uint32_t h) { return dlopt::rt::cuda::kernels::toF(T{uint16_t(h)}); }

/// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32, per the PTX ISA:
/// groupID = lane>>2, tig = lane%4.
/// A a0..a7 (reg i/2, lower index in low half): row = g (+8 for a2,a3,a6,a7), col = 2tig+(i&1) (+8 for i>=4)
/// B b0..b3: k = 2tig+(i&1) (+8 for i>=2), n = g
/// C/D c0..c3: row = g (+8 for c2,c3), col = 2tig+(i&1)
template <typename T> void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  Warp &w = warp(); int l = lane();
  for (int i = 0; i < 4; ++i) { w.a[l][i] = a[i]; w.c[l][i] = d[i]; }
  w.b[l][0] = b0; w.b[l][1] = b1;
  warpBarrier();
  float A[16][16], B[16][8], C[16][8]; int ca[16][16] = {}, cb[16][8] = {}, cc[16][8] = {};
  for (int L = 0; L < 32; ++L) {
    int g = L >> 2, t = L & 3;
    for (int i = 0; i < 8; ++i) {
      uint32_t r = w.a[L][i / 2]; uint32_t h = (i & 1) ? r >> 16 : r & 0xffff;
      int row = g + (((i >= 2 && i < 4) || i >= 6) ? 8 : 0), col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
      A[row][col] = cvt<T>(h); ca[row][col]++;
    }
    for (int i = 0; i < 4; ++i) {
      uint32_t r = w.b[L][i / 2]; uint32_t h = (i & 1) ? r >> 16 : r & 0xffff;
      int k = 2 * t + (i & 1) + (i >= 2 ? 8 : 0);
      B[k][g] = cvt<T>(h); cb[k][g]++;
    }
    for (int i = 0; i < 4; ++i) { int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1); C[row][col] = w.c[L][i]; cc[row][col]++; }
  }
  for (auto &r : ca) for (int x : r) assert(x == 1);
  for (auto &r : cb) for (int x : r) assert(x == 1);
  for (auto &r : cc) for (int x : r) assert(x == 1);
  int g = l >> 2, t = l & 3;
  for (int i = 0; i < 4; ++i) {
    int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
    float s = C[row][col];
    for (int k = 0; k < 16; ++k) s += A[row][k] * B[k][col];
    d[i] = s;
  }
  if (l == 0) ++mmaCount;
  warpBarrier();
}

/// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16: lane 8m+r gives the address of
/// row r of matrix m (16 bytes); without .trans lane L gets, in reg m, row L/4,
/// elements 2(L%4), 2(L%4)+1 of matrix m; with .trans the transpose: elements
/// (row 2(L%4), col L/4) [low half] and (row 2(L%4)+1, col L/4) [high half].
inline void ldmatrixX4Trans(uint32_t (&b)[4], const uint16_t *p) {
  Warp &w = warp(); int l = lane();
  checkSmem(p, 16, 16);
  w.addr[l] = p;
  warpBarrier();
  if (l == 0) {
    ++ldmCount;
    for (int m = 0; m < 4; ++m) {  // one wavefront per 8x8 matrix ideally
      std::vector<long> words[32];
      for (int r = 0; r < 8; ++r) {
        long wd = (static_cast<const unsigned char *>(w.addr[8 * m + r]) - smemBase) / 4;
        for (int q = 0; q < 4; ++q) { auto &v = words[(wd + q) % 32]; if (std::find(v.begin(), v.end(), wd + q) == v.end()) v.push_back(wd + q); }
      }
      for (auto &v : words) maxLdmConflict = std::max(maxLdmConflict, int(v.size()));
    }
  }
  for (int m = 0; m < 4; ++m) {
    auto *r0 = static_cast<const uint16_t *>(w.addr[8 * m + 2 * (l % 4)]);
    auto *r1 = static_cast<const uint16_t *>(w.addr[8 * m + 2 * (l % 4) + 1]);
    b[m] = uint32_t(r0[l / 4]) | (uint32_t(r1[l / 4]) << 16);
  }
  warpBarrier();
}

inline uint32_t ld32(const uint16_t *p) {
  Warp &w = warp(); int l = lane();
  checkSmem(p, 4, 4);
  w.addr[l] = p;
  warpBarrier();
  if (l == 0) {
    ++ld32Count;
    std::vector<long> words[32];
    for (int L = 0; L < 32; ++L) {
      long wd = (static_cast<const unsigned char *>(w.addr[L]) - smemBase) / 4;
      auto &v = words[wd % 32]; if (std::find(v.begin(), v.end(), wd) == v.end()) v.push_back(wd);
    }
    for (auto &v : words) maxLd32Conflict = std::max(maxLd32Conflict, int(v.size()));
  }
  uint32_t r; memcpy(&r, p, 4);
  warpBarrier();
  return r;
}
inline float shflXor(float v, int m) {
  Warp &w = warp(); int l = lane();
  w.f[l] = v; warpBarrier(); float r = w.f[l ^ m]; warpBarrier(); return r;
}
inline void entry() { body(); fibers[cur]->done = true; swapcontext(&fibers[cur]->ctx, &mainCtx); }

/// Runs body over the grid, block by block, 128 fibers a block.
inline void launch(Dim3 grid, size_t smemBytes, std::function<void()> fn) {
  body = std::move(fn);
  smemSize = smemBytes;
  size_t alloc = (smemBytes + 127) / 128 * 128;
  assert(alloc == smemBytes);
  for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      smemBase = static_cast<unsigned char *>(aligned_alloc(128, alloc));
      memset(smemBase, 0xFF, alloc); // NaN pattern: uninitialised reads show
      blockIdxV = {bx, by, 0};
      blockCount = 0;
      for (auto &w : warps) w.count = 0;
      static Fiber pool[NT]; // stacks allocated once, reused by every block
      for (int t = 0; t < NT; ++t) {
        fibers[t] = &pool[t];
        fibers[t]->done = false;
        fibers[t]->tid = {unsigned(t), 0, 0};
        if (fibers[t]->stack.empty())
          fibers[t]->stack.resize(1 << 18);
        getcontext(&fibers[t]->ctx);
        fibers[t]->ctx.uc_stack.ss_sp = fibers[t]->stack.data();
        fibers[t]->ctx.uc_stack.ss_size = fibers[t]->stack.size();
        fibers[t]->ctx.uc_link = nullptr;
        makecontext(&fibers[t]->ctx, entry, 0);
      }
      for (bool any = true; any;) {
        any = false;
        for (int t = 0; t < NT; ++t)
          if (!fibers[t]->done) { any = true; cur = t; swapcontext(&mainCtx, &fibers[t]->ctx); }
      }
      assert(blockCount == 0);
      for (auto &w : warps) assert(w.count == 0);
      free(smemBase);
    }
}
} // namespace emu

#define threadIdx (emu::fibers[emu::cur]->tid)
#define blockIdx (emu::blockIdxV)
#define blockDim (emu::blockDimV)
#define __syncthreads() emu::syncthreads()
#define __shfl_xor_sync(mask, v, m) emu::shflXor(v, m)
