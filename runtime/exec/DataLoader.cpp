//===- DataLoader.cpp - Batches for training and evaluation loops ---------===//

#include "runtime/exec/DataLoader.h"
#include "runtime/exec/Npy.h"
#include "runtime/exec/ParamInit.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <numbers>
#include <set>

namespace dlopt::rt {

namespace {

/// Stream ids: data streams never collide with each other or with the
/// param-init streams (which use word(seed, p) directly).
constexpr uint64_t kDataSalt = 0x64617461'00000000ull; // "data"
constexpr uint64_t kShuffleStream = 1;
constexpr uint64_t kSyntheticStream = 2;

int32_t findInput(const Executable &exe, const std::string &name) {
  for (int32_t id : exe.inputs)
    if (exe.values[id].name == name)
      return id;
  return -1;
}

std::string inputList(const Executable &exe) {
  std::string s;
  for (int32_t id : exe.inputs)
    s += (s.empty() ? "" : ", ") + exe.values[id].name + " (" +
         exe.values[id].type.str() + ")";
  return s.empty() ? "none" : s;
}

void setInt(HostTensor &t, int64_t i, int64_t v) {
  switch (t.type.dtype) {
  case DType::I32: {
    int32_t x = int32_t(v);
    std::memcpy(t.bytes.data() + 4 * i, &x, 4);
    break;
  }
  case DType::I64: std::memcpy(t.bytes.data() + 8 * i, &v, 8); break;
  default: t.setElementFromDouble(i, double(v)); break;
  }
}

/// v * n / 2^64: a draw from [0, n) (multiply-shift; its bias, below
/// n / 2^64, is far under anything a training run can observe).
uint64_t scaled(uint64_t v, uint64_t n) {
  return uint64_t((unsigned __int128)v * n >> 64);
}

/// Calls f(begin, end) for each run of C-order linear indices [begin, end)
/// of a tensor of `shape` inside `box` (all of it when null), in
/// increasing order.
template <typename F>
void forEachRunInBox(const std::vector<int64_t> &shape, const Box *box, F f) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  if (!box) {
    if (n > 0)
      f(int64_t(0), n);
    return;
  }
  if (box->empty() || n == 0)
    return;
  size_t rank = shape.size();
  if (rank == 0) {
    f(int64_t(0), int64_t(1));
    return;
  }
  std::vector<int64_t> stride(rank, 1);
  for (size_t d = rank - 1; d-- > 0;)
    stride[d] = stride[d + 1] * shape[d + 1];
  std::vector<int64_t> idx(box->lo.begin(), box->lo.end());
  while (true) {
    int64_t base = 0;
    for (size_t d = 0; d + 1 < rank; ++d)
      base += idx[d] * stride[d];
    f(base + box->lo[rank - 1], base + box->hi[rank - 1]);
    size_t d = rank - 1;
    while (d-- > 0) {
      if (++idx[d] < box->hi[d])
        break;
      idx[d] = box->lo[d];
    }
    if (d == size_t(-1))
      return;
  }
}

/// Calls f(i) for the C-order linear index i of every element of a tensor
/// of `shape` inside `box` (every element when null), in increasing order.
template <typename F>
void forEachInBox(const std::vector<int64_t> &shape, const Box *box, F f) {
  forEachRunInBox(shape, box, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      f(i);
  });
}

/// The part [lo, hi) of [0, n) that share `s` covers.
std::pair<uint64_t, uint64_t> shareRange(uint64_t n, DataShare s) {
  uint64_t c = uint64_t(std::max(1, s.count));
  uint64_t i = uint64_t(std::clamp(s.index, 0, int(c) - 1));
  return {uint64_t((unsigned __int128)n * i / c),
          uint64_t((unsigned __int128)n * (i + 1) / c)};
}

//===----------------------------------------------------------------------===//
// Token streams
//===----------------------------------------------------------------------===//

/// The little-endian integer of `width` bytes at `p`, sign-extended when
/// `isSigned`.
int64_t decodeInt(const uint8_t *p, size_t width, bool isSigned) {
  uint64_t u = 0;
  for (size_t b = 0; b < width; ++b)
    u |= uint64_t(p[b]) << (8 * b);
  int64_t v = int64_t(u);
  if (isSigned && width < 8 && (u >> (8 * width - 1)) & 1)
    v = int64_t(u | (~uint64_t(0) << (8 * width)));
  return v;
}

/// The token ids of a token file. A regular file is mapped read-only and
/// decoded a window at a time, so a process keeps no copy of the file and,
/// past the load-time check, reads only each batch's windows. Pipes and
/// Fortran-order arrays are decoded whole into memory.
class TokenStore {
public:
  TokenStore() = default;
  TokenStore(const TokenStore &) = delete;
  TokenStore &operator=(const TokenStore &) = delete;

  /// Decoded tokens.
  explicit TokenStore(std::vector<int32_t> tokens)
      : owned_(std::move(tokens)), size_(owned_.size()) {}

  /// The tokens of mapped `file`: `count` little-endian integers of
  /// `width` bytes from `offset`.
  static std::unique_ptr<TokenStore> map(std::unique_ptr<MappedFile> file,
                                         size_t offset, size_t width,
                                         bool isSigned, uint64_t count) {
    auto s = std::make_unique<TokenStore>();
    s->data_ = file->data() + offset;
    s->file_ = std::move(file);
    s->width_ = width;
    s->signed_ = isSigned;
    s->size_ = count;
    return s;
  }

  uint64_t size() const { return size_; }

  /// Token i as stored (checked to be a valid id when the file was loaded).
  int64_t raw(uint64_t i) const {
    return file_ ? decodeInt(data_ + i * width_, width_, signed_) : owned_[i];
  }
  int32_t at(uint64_t i) const { return int32_t(raw(i)); }

private:
  std::vector<int32_t> owned_;
  std::unique_ptr<MappedFile> file_;
  const uint8_t *data_ = nullptr;
  size_t width_ = 4;
  bool signed_ = true;
  uint64_t size_ = 0;
};

class TokenLoader final : public DataLoader {
public:
  TokenLoader(std::string path, std::unique_ptr<TokenStore> tokens,
              TensorType tokensType, std::optional<TensorType> labelsType)
      : path_(std::move(path)), tokens_(std::move(tokens)),
        tokensType_(std::move(tokensType)), labelsType_(std::move(labelsType)) {
    // [B, S], or [K, B, S] for a step that accumulates K micro-batches:
    // the rows are consecutive windows either way, so K micro-batches of B
    // see exactly the windows one batch of K*B would.
    batch_ = 1;
    for (size_t d = 0; d + 1 < tokensType_.shape.size(); ++d)
      batch_ *= tokensType_.shape[d];
    seq_ = tokensType_.shape.back();
    numWindows_ = (tokens_->size() - 1) / uint64_t(seq_);
  }

  Expected<std::vector<NamedTensor>> batch(uint64_t index,
                                           uint64_t) const override {
    std::vector<NamedTensor> out;
    out.push_back({"tokens", HostTensor(tokensType_)});
    if (labelsType_)
      out.push_back({"labels", HostTensor(*labelsType_)});
    fill(out[0].tensor, region("tokens"), index, 0);
    if (labelsType_)
      fill(out[1].tensor, region("labels"), index, 1);
    return out;
  }
  std::vector<std::string> inputs() const override {
    if (labelsType_)
      return {"tokens", "labels"};
    return {"tokens"};
  }
  uint64_t batchesPerEpoch() const override {
    return std::max<uint64_t>(1, numWindows_ / uint64_t(batch_));
  }
  uint64_t epochOf(uint64_t index) const override {
    // index*B / numWindows, in 128 bits.
    return uint64_t((unsigned __int128)index * uint64_t(batch_) / numWindows_);
  }
  std::string describe() const override { return "tokens:" + path_; }

private:
  /// Element (r, s) of batch `index`'s rows (flattened over the leading
  /// dims) is token s + shift of window r's; only those inside `box`.
  void fill(HostTensor &t, const Box *box, uint64_t index,
            uint64_t shift) const {
    forEachInBox(t.type.shape, box, [&](int64_t i) {
      int64_t r = i / seq_, s = i % seq_;
      uint64_t w = uint64_t(((unsigned __int128)index * uint64_t(batch_) +
                             uint64_t(r)) %
                            numWindows_);
      setInt(t, i, tokens_->at(w * uint64_t(seq_) + uint64_t(s) + shift));
    });
  }

  std::string path_;
  std::unique_ptr<TokenStore> tokens_;
  TensorType tokensType_;
  std::optional<TensorType> labelsType_;
  int64_t batch_ = 1, seq_ = 1;
  uint64_t numWindows_ = 1;
};

/// Width and signedness of token dtype `descr`.
Status tokenWidth(const std::string &descr, size_t &width, bool &isSigned) {
  if (descr == "<u2" || descr == "=u2") {
    width = 2, isSigned = false;
  } else if (descr == "<i4" || descr == "=i4") {
    width = 4, isSigned = true;
  } else if (descr == "<u4" || descr == "=u4") {
    width = 4, isSigned = false;
  } else if (descr == "<i8" || descr == "=i8") {
    width = 8, isSigned = true;
  } else if (descr == "|u1" || descr == "<u1") {
    width = 1, isSigned = false;
  } else {
    return Status::error("token dtype '" + descr +
                         "' is not supported (use uint8, uint16, int32, "
                         "uint32 or int64)");
  }
  return Status::ok();
}

/// Decodes little-endian integers of NumPy dtype `descr` into token ids.
Status decodeTokens(const uint8_t *p, size_t bytes, const std::string &descr,
                    std::vector<int32_t> &out) {
  size_t width;
  bool isSigned;
  DLOPT_RETURN_IF_ERROR(tokenWidth(descr, width, isSigned));
  if (bytes % width)
    return Status::error("size " + std::to_string(bytes) +
                         " bytes is not a multiple of the token size " +
                         std::to_string(width));
  size_t n = bytes / width;
  out.resize(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t v = decodeInt(p + i * width, width, isSigned);
    if (v < 0 || v > std::numeric_limits<int32_t>::max())
      return Status::error("token " + std::to_string(v) + " at position " +
                           std::to_string(i) + " is not a valid id");
    out[i] = int32_t(v);
  }
  return Status::ok();
}

/// C-order element order of a Fortran-order array stored in `in`.
std::vector<int32_t> fortranToC(const std::vector<int32_t> &in,
                                const std::vector<int64_t> &shape) {
  std::vector<int32_t> out(in.size());
  size_t rank = shape.size();
  std::vector<int64_t> idx(rank, 0);
  // Walk the C order (last index fastest), keeping the Fortran offset
  // (first index fastest) in step.
  std::vector<int64_t> fstride(rank, 1);
  for (size_t d = 1; d < rank; ++d)
    fstride[d] = fstride[d - 1] * shape[d - 1];
  int64_t f = 0;
  for (size_t c = 0; c < out.size(); ++c) {
    out[c] = in[size_t(f)];
    for (size_t d = rank; d-- > 0;) {
      if (++idx[d] < shape[d]) {
        f += fstride[d];
        break;
      }
      f -= fstride[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
  return out;
}

//===----------------------------------------------------------------------===//
// Arrays
//===----------------------------------------------------------------------===//

class ArrayLoader final : public DataLoader {
public:
  struct Array {
    std::string name, file;
    std::unique_ptr<MappedNpy> map; ///< the file, mapped; or
    HostTensor whole;               ///< the file, read whole
    DType source = DType::F32;      ///< the file's element type
    TensorType type; ///< the input's type, [B, sample...] or [K, B, sample...]
    int lead = 1;    ///< its leading dims that index samples (1 or 2)
    const uint8_t *samples() const {
      return map ? map->data() : whole.bytes.data();
    }
    const TensorType &fileType() const {
      return map ? map->type() : whole.type;
    }
  };
  ArrayLoader(std::vector<Array> arrays, int64_t samples, int64_t batch,
              bool shuffle)
      : arrays_(std::move(arrays)), samples_(samples), batch_(batch),
        shuffle_(shuffle) {}

  Expected<std::vector<NamedTensor>> batch(uint64_t index,
                                           uint64_t seed) const override {
    uint64_t nb = batchesPerEpoch();
    uint64_t epoch = index / nb, k = index % nb;
    std::vector<uint64_t> rows(static_cast<size_t>(batch_));
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shuffle_ && (!cached_ || cachedEpoch_ != epoch ||
                       cachedSeed_ != seed)) {
        perm_ = shuffledIndices(uint64_t(samples_),
                                dataKey(seed, kShuffleStream, epoch));
        cached_ = true;
        cachedEpoch_ = epoch;
        cachedSeed_ = seed;
      }
      for (int64_t r = 0; r < batch_; ++r) {
        uint64_t pos = k * uint64_t(batch_) + uint64_t(r);
        rows[r] = shuffle_ ? perm_[pos] : pos;
      }
    }
    std::vector<NamedTensor> out;
    for (const Array &a : arrays_) {
      // Samples in the file's type, then converted: only the rows this
      // process reads (a box's dim-0 range) are copied out of the file.
      HostTensor t(TensorType{a.source, a.type.shape});
      size_t rowBytes = t.bytes.size() / size_t(batch_);
      // Row r of the batch is sample r of the flattened leading dims; a
      // row is read when the box holds its leading index.
      const Box *box = region(a.name);
      if (box && box->empty())
        box = nullptr, rowBytes = 0;
      for (int64_t r = 0; r < batch_ && rowBytes; ++r) {
        if (box) {
          int64_t inner = a.lead == 2 ? a.type.shape[1] : batch_;
          int64_t i0 = a.lead == 2 ? r / inner : r, i1 = r % inner;
          if (i0 < box->lo[0] || i0 >= box->hi[0] ||
              (a.lead == 2 && (i1 < box->lo[1] || i1 >= box->hi[1])))
            continue;
        }
        std::memcpy(t.bytes.data() + r * rowBytes,
                    a.samples() + rows[r] * rowBytes, rowBytes);
      }
      if (a.source == DType::I1)
        for (uint8_t &b : t.bytes)
          b = b ? 1 : 0;
      if (a.source != a.type.dtype)
        t = convertTensor(t, a.type.dtype);
      out.push_back({a.name, std::move(t)});
    }
    return out;
  }
  std::vector<std::string> inputs() const override {
    std::vector<std::string> names;
    for (const Array &a : arrays_)
      names.push_back(a.name);
    return names;
  }
  uint64_t batchesPerEpoch() const override {
    return uint64_t(samples_ / batch_);
  }
  uint64_t epochOf(uint64_t index) const override {
    return index / batchesPerEpoch();
  }
  std::string describe() const override {
    std::string s = "arrays:";
    for (size_t i = 0; i < arrays_.size(); ++i)
      s += (i ? "," : "") + arrays_[i].name + "=" + arrays_[i].file;
    return s;
  }

private:
  std::vector<Array> arrays_;
  int64_t samples_, batch_;
  bool shuffle_;
  mutable std::mutex mu_;
  mutable std::vector<uint64_t> perm_;
  mutable bool cached_ = false;
  mutable uint64_t cachedEpoch_ = 0, cachedSeed_ = 0;
};

//===----------------------------------------------------------------------===//
// Synthetic data
//===----------------------------------------------------------------------===//

class SyntheticLoader final : public DataLoader {
public:
  struct Input {
    std::string name;
    TensorType type;
    uint64_t position; ///< index in Executable::inputs: its stream id
    int64_t range;     ///< ints: values in [0, range)
  };
  explicit SyntheticLoader(std::vector<Input> inputs)
      : inputs_(std::move(inputs)) {}

  Expected<std::vector<NamedTensor>> batch(uint64_t index,
                                           uint64_t seed) const override {
    std::vector<NamedTensor> out;
    for (const Input &in : inputs_) {
      HostTensor t(in.type);
      // One stream per (input, batch): element i is word i of it.
      uint64_t key = initWord(
          dataKey(seed, kSyntheticStream, in.position), index);
      // Only the elements this process reads are drawn.
      const Box *box = region(in.name);
      if (isFloat(in.type.dtype)) {
        // Element i is syntheticNormal(word(key, i)), drawn a run at a time.
        std::vector<float> run;
        forEachRunInBox(in.type.shape, box, [&](int64_t begin, int64_t end) {
          if (in.type.dtype == DType::F32) {
            syntheticNormals(key, uint64_t(begin), end - begin,
                             t.data<float>() + begin);
            return;
          }
          run.resize(size_t(end - begin));
          syntheticNormals(key, uint64_t(begin), end - begin, run.data());
          for (int64_t i = begin; i < end; ++i)
            t.setElementFromDouble(i, run[size_t(i - begin)]);
        });
      } else if (in.type.dtype == DType::I1) {
        forEachInBox(in.type.shape, box, [&](int64_t i) {
          t.bytes[i] = uint8_t(initWord(key, uint64_t(i)) >> 63);
        });
      } else {
        forEachInBox(in.type.shape, box, [&](int64_t i) {
          setInt(t, i,
                 int64_t(scaled(initWord(key, uint64_t(i)), uint64_t(in.range))));
        });
      }
      out.push_back({in.name, std::move(t)});
    }
    return out;
  }
  std::vector<std::string> inputs() const override {
    std::vector<std::string> names;
    for (const Input &in : inputs_)
      names.push_back(in.name);
    return names;
  }
  uint64_t batchesPerEpoch() const override { return 0; }
  uint64_t epochOf(uint64_t) const override { return 0; }
  std::string describe() const override { return "synthetic"; }

private:
  std::vector<Input> inputs_;
};

} // namespace

namespace {

typedef float V8f __attribute__((vector_size(32)));
typedef int32_t V8i __attribute__((vector_size(32)));

V8f splat(float v) { return V8f{v, v, v, v, v, v, v, v}; }

/// One lane of the generator: from the word's top 24 bits k, x = 2u - 1
/// for u = (k + 1/2) / 2^24 (exact in float) and q = (1 - x)(1 + x) =
/// (2^48 - j^2) / 2^48 with j = 2k + 1 - 2^24, rounded once.
void normalInputs(uint64_t word, float &x, float &q) {
  const int64_t j = 2 * int64_t(word >> 40) + 1 - (int64_t(1) << 24);
  x = float(j) * 0x1.0p-24f;
  q = float((int64_t(1) << 48) - j * j) * 0x1.0p-48f;
}

/// Giles' tail branch (w = -log q >= 5, |x| > 0.9966: about 0.3% of the
/// draws), in scalar float arithmetic.
float normalTail(float x, float w) {
  w = std::sqrt(w) - 3.0f;
  float p = -0.000200214257f;
  p = 0.000100950558f + p * w;
  p = 0.00134934322f + p * w;
  p = -0.00367342844f + p * w;
  p = 0.00573950773f + p * w;
  p = -0.0076224613f + p * w;
  p = 0.00943887047f + p * w;
  p = 1.00167406f + p * w;
  p = 2.83297682f + p * w;
  return std::numbers::sqrt2_v<float> * (p * x);
}

/// Eight normals from (x, q) lanes (normalInputs), written to out[0..8):
/// w = -log q by its exponent and an odd series in s = (m - 1)/(m + 1)
/// for the mantissa m in [sqrt(1/2), sqrt(2)) (|s| <= 0.172: truncation
/// below 3e-9), then Giles' central polynomial (w < 5) in every lane and
/// the tail branch for lanes past it. Only IEEE +, -, *, / on lanes (no
/// libm, no fused multiply-add: this file is built with
/// -ffp-contract=off), so every machine draws the same bits.
inline __attribute__((always_inline)) void normalLanes(V8f x, V8f q,
                                                    float *out) {
  V8i bits;
  std::memcpy(&bits, &q, sizeof bits);
  V8i e = ((bits >> 23) & 0xff) - 127;
  V8i mb = (bits & 0x7fffff) | 0x3f800000; // m in [1, 2)
  V8f m;
  std::memcpy(&m, &mb, sizeof m);
  V8i big = m > 1.41421356f; // all-ones lanes: m -> m/2, e -> e + 1
  V8f one = splat(1.0f);
  V8i hb;
  std::memcpy(&hb, &one, sizeof hb);
  V8i scaledBits = hb - (big & 0x00800000); // 1.0f or 0.5f
  V8f scale;
  std::memcpy(&scale, &scaledBits, sizeof scale);
  m *= scale;
  e -= big; // big lanes are -1
  V8f s = (m - 1.0f) / (m + 1.0f);
  V8f s2 = s * s;
  V8f series = splat(1.0f / 9);
  series = 1.0f / 7 + series * s2;
  series = 1.0f / 5 + series * s2;
  series = 1.0f / 3 + series * s2;
  series = 1.0f + series * s2;
  V8f ef = __builtin_convertvector(e, V8f);
  V8f w = -(ef * 0.693147182f + 2.0f * s * series);
  V8f c = w - 2.5f;
  V8f p = splat(2.81022636e-08f);
  p = 3.43273939e-07f + p * c;
  p = -3.5233877e-06f + p * c;
  p = -4.39150654e-06f + p * c;
  p = 0.00021858087f + p * c;
  p = -0.00125372503f + p * c;
  p = -0.00417768164f + p * c;
  p = 0.246640727f + p * c;
  p = 1.50140941f + p * c;
  V8f z = std::numbers::sqrt2_v<float> * (p * x);
  for (int l = 0; l < 8; ++l)
    out[l] = w[l] < 5.0f ? z[l] : normalTail(x[l], w[l]);
}

} // namespace

void syntheticNormals(uint64_t key, uint64_t first, int64_t n, float *out) {
  float xs[8], qs[8];
  V8f x, q;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l)
      normalInputs(initWord(key, first + uint64_t(i + l)), xs[l], qs[l]);
    std::memcpy(&x, xs, sizeof x);
    std::memcpy(&q, qs, sizeof q);
    normalLanes(x, q, out + i);
  }
  if (i < n) {
    // The last lanes like any other: unused ones draw from q = 1.
    for (int l = 0; l < 8; ++l) {
      xs[l] = 0, qs[l] = 1;
      if (i + l < n)
        normalInputs(initWord(key, first + uint64_t(i + l)), xs[l], qs[l]);
    }
    std::memcpy(&x, xs, sizeof x);
    std::memcpy(&q, qs, sizeof q);
    float rest[8];
    normalLanes(x, q, rest);
    std::memcpy(out + i, rest, size_t(n - i) * sizeof(float));
  }
}

float syntheticNormal(uint64_t word) {
  float xs[8] = {}, qs[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  normalInputs(word, xs[0], qs[0]);
  V8f x, q;
  std::memcpy(&x, xs, sizeof x);
  std::memcpy(&q, qs, sizeof q);
  float out[8];
  normalLanes(x, q, out);
  return out[0];
}

uint64_t dataKey(uint64_t seed, uint64_t stream, uint64_t index) {
  return initWord(initWord(seed ^ kDataSalt, stream), index);
}

std::vector<uint64_t> shuffledIndices(uint64_t n, uint64_t key) {
  std::vector<uint64_t> perm(n);
  for (uint64_t i = 0; i < n; ++i)
    perm[i] = i;
  for (uint64_t i = n; i > 1; --i) {
    uint64_t j = scaled(initWord(key, i - 1), i);
    std::swap(perm[i - 1], perm[j]);
  }
  return perm;
}

std::optional<int64_t> inferIntRange(const Executable &exe, int32_t inputId) {
  std::optional<int64_t> best;
  auto bound = [&](int64_t v) {
    if (v > 0 && (!best || v < *best))
      best = v;
  };
  // Values carrying the input's elements unchanged, found forward.
  std::set<int32_t> carriers = {inputId};
  static const std::set<std::string> preserving = {
      "reshape", "transpose", "slice", "broadcast_to", "concat", "cast"};
  for (const Program &p : exe.programs)
    for (const Instr &in : p.instrs) {
      auto reads = [&](size_t k) {
        return k < in.operands.size() && carriers.count(in.operands[k]);
      };
      auto type = [&](int32_t id) -> const TensorType & {
        return exe.values[id].type;
      };
      bool anyRead = false;
      for (int32_t o : in.operands)
        anyRead |= carriers.count(o) != 0;
      if (!anyRead)
        continue;
      if (preserving.count(in.op)) {
        bool intResult = !in.results.empty() &&
                         isInteger(type(in.results[0]).dtype);
        if (intResult)
          carriers.insert(in.results.begin(), in.results.end());
      } else if (in.op == "gather" && reads(1)) {
        if (!type(in.operands[0]).shape.empty())
          bound(type(in.operands[0]).shape[0]);
      } else if (in.op == "scatter_add" && reads(0) && !in.results.empty()) {
        if (!type(in.results[0]).shape.empty())
          bound(type(in.results[0]).shape[0]);
      } else if ((in.op == "cross_entropy" || in.op == "cross_entropy_grad") &&
                 reads(1)) {
        if (!type(in.operands[0]).shape.empty())
          bound(type(in.operands[0]).shape.back());
      }
    }
  return best;
}

Expected<std::vector<int32_t>>
decodeTokenFile(const std::vector<uint8_t> &bytes, TokenDType rawDType) {
  std::vector<int32_t> tokens;
  if (bytes.size() >= 6 && std::memcmp(bytes.data(), "\x93NUMPY", 6) == 0) {
    Expected<NpyHeader> h = parseNpyHeader(bytes);
    if (!h)
      return h.status();
    DLOPT_RETURN_IF_ERROR(decodeTokens(bytes.data() + h->dataOffset,
                                       bytes.size() - h->dataOffset, h->descr,
                                       tokens));
    if (int64_t(tokens.size()) != h->numElements)
      return Status::error("the header's shape holds " +
                           std::to_string(h->numElements) +
                           " tokens, the file " +
                           std::to_string(tokens.size()));
    if (h->fortranOrder)
      tokens = fortranToC(tokens, h->shape);
    return tokens;
  }
  Status st = decodeTokens(bytes.data(), bytes.size(),
                           rawDType == TokenDType::U16 ? "<u2" : "<i4", tokens);
  if (!st)
    return st.withContext(
        std::string("(raw ") +
        (rawDType == TokenDType::U16 ? "uint16" : "int32") + " tokens): ");
  return tokens;
}

/// The tokens of `path`, mapped (regular files) or decoded whole (pipes,
/// Fortran-order arrays). Any file the mapped path does not accept goes
/// the whole-file way, which also gives every error its usual message.
static Expected<std::unique_ptr<TokenStore>>
openTokenFile(const std::string &path, TokenDType rawDType, DataShare share) {
  auto readWhole = [&]() -> Expected<std::unique_ptr<TokenStore>> {
    Expected<std::vector<uint8_t>> bytes = readFileBytes(path, "token file");
    if (!bytes)
      return bytes.status();
    Expected<std::vector<int32_t>> decoded = decodeTokenFile(*bytes, rawDType);
    if (!decoded)
      return decoded.status().withContext(path + ": ");
    return std::make_unique<TokenStore>(decoded.take());
  };
  std::unique_ptr<MappedFile> file = MappedFile::open(path);
  if (!file)
    return readWhole();
  const size_t size = file->size();
  // A .npy header is far under 1 MiB; a longer one goes the whole way.
  const std::vector<uint8_t> head = file->head(size_t(1) << 20);
  size_t offset = 0, width = 4;
  bool isSigned = true;
  uint64_t count = 0;
  if (size >= 6 && std::memcmp(head.data(), "\x93NUMPY", 6) == 0) {
    Expected<NpyHeader> h = parseNpyHeader(head);
    if (!h || (h->fortranOrder && h->shape.size() > 1) ||
        !tokenWidth(h->descr, width, isSigned).isOk() ||
        h->dataOffset > size || (size - h->dataOffset) % width != 0 ||
        uint64_t((size - h->dataOffset) / width) != uint64_t(h->numElements))
      return readWhole();
    offset = h->dataOffset;
    count = (size - offset) / width;
  } else {
    width = rawDType == TokenDType::U16 ? 2 : 4;
    isSigned = rawDType != TokenDType::U16;
    if (size % width != 0)
      return readWhole();
    count = size / width;
  }
  std::unique_ptr<TokenStore> store =
      TokenStore::map(std::move(file), offset, width, isSigned, count);
  // This process checks its share of the ids; the others check theirs.
  auto [lo, hi] = shareRange(count, share);
  for (uint64_t i = lo; i < hi; ++i) {
    int64_t v = store->raw(i);
    if (v < 0 || v > std::numeric_limits<int32_t>::max())
      return readWhole(); // names the token and its position
  }
  return store;
}

static Expected<std::unique_ptr<DataLoader>>
createTokenLoaderImpl(const Executable &exe, const std::string &path,
                      TokenDType rawDType, DataShare share) {
  int32_t tokId = findInput(exe, "tokens");
  if (tokId < 0)
    return Status::error("--data feeds the input 'tokens', which the model "
                         "does not have (inputs: " +
                         inputList(exe) +
                         "); use --data-input NAME=FILE.npy for other inputs");
  const TensorType &tt = exe.values[tokId].type;
  bool shapeOk = (tt.shape.size() == 2 || tt.shape.size() == 3) &&
                 isInteger(tt.dtype);
  for (int64_t d : tt.shape)
    shapeOk = shapeOk && d >= 1;
  if (!shapeOk)
    return Status::error("--data needs the input 'tokens' to be [batch, seq] "
                         "integers (or [micro-batches, batch, seq] for "
                         "--accumulate), got " + tt.str());
  std::optional<TensorType> labelsType;
  int32_t labId = findInput(exe, "labels");
  if (labId >= 0) {
    const TensorType &lt = exe.values[labId].type;
    if (lt.shape != tt.shape || !isInteger(lt.dtype))
      return Status::error("--data needs the input 'labels' to be integers "
                           "shaped like 'tokens' (" + tt.str() + "), got " +
                           lt.str());
    labelsType = lt;
  }

  Expected<std::unique_ptr<TokenStore>> opened = openTokenFile(path, rawDType, share);
  if (!opened)
    return opened.status();
  std::unique_ptr<TokenStore> tokens = opened.take();
  int64_t seq = tt.shape.back();
  if (tokens->size() < uint64_t(seq) + 1)
    return Status::error(path + ": " + std::to_string(tokens->size()) +
                         " tokens, but one window of the input 'tokens' (" +
                         tt.str() + ") needs seq + 1 = " +
                         std::to_string(seq + 1));
  std::optional<int64_t> vocab = inferIntRange(exe, tokId);
  if (labId >= 0) {
    std::optional<int64_t> c = inferIntRange(exe, labId);
    if (c && (!vocab || *c < *vocab))
      vocab = c;
  }
  auto [lo, hi] = shareRange(tokens->size(), share);
  if (vocab)
    for (uint64_t i = lo; i < hi; ++i)
      if (tokens->at(i) >= *vocab)
        return Status::error(path + ": token " + std::to_string(tokens->at(i)) +
                             " at position " + std::to_string(i) +
                             " is outside the model's vocabulary [0, " +
                             std::to_string(*vocab) + ")");
  return std::unique_ptr<DataLoader>(
      new TokenLoader(path, std::move(tokens), tt, labelsType));
}

static Expected<std::unique_ptr<DataLoader>> createArrayLoaderImpl(
    const Executable &exe,
    const std::vector<std::pair<std::string, std::string>> &files,
    bool shuffle, DataShare share) {
  if (files.empty())
    return Status::error("no arrays given");
  std::vector<ArrayLoader::Array> arrays;
  int64_t samples = -1, batch = -1;
  std::string first;
  for (const auto &[name, file] : files) {
    std::string what = name + "=" + file + ": ";
    int32_t id = findInput(exe, name);
    if (id < 0)
      return Status::error(what + "the model has no input '" + name +
                           "' (inputs: " + inputList(exe) + ")");
    const TensorType &type = exe.values[id].type;
    if (type.shape.empty())
      return Status::error(what + "input '" + name +
                           "' is a scalar; batches are sliced along dim 0");
    // Mapped when the file allows it (only the rows a batch uses are then
    // read); otherwise read whole, which also reports what is wrong.
    ArrayLoader::Array a;
    a.name = name;
    a.file = file;
    a.type = type;
    a.map = MappedNpy::tryMap(file);
    if (!a.map) {
      Expected<HostTensor> arr = readNpy(file);
      if (!arr)
        return arr.status();
      a.whole = arr.take();
    }
    const TensorType &dataType = a.fileType();
    a.source = dataType.dtype;
    if (dataType.shape.empty()) {
      TensorType want{type.dtype, {type.shape.begin() + 1, type.shape.end()}};
      return Status::error(what + "expected N samples of " + want.str() +
                           " (input '" + name + "' is " + type.str() +
                           "), got " + dataType.str());
    }
    for (const auto &other : arrays)
      if (other.name == name)
        return Status::error(what + "input '" + name + "' given twice");
    arrays.push_back(std::move(a));
  }
  // Samples are shaped like the input without its batch dim or, when every
  // array fits an input of K micro-batches [K, B, ...] (and the samples of
  // one are not scalars, which would be ambiguous), without both.
  auto sampleOf = [](const TensorType &t) {
    return std::vector<int64_t>(t.shape.begin() + 1, t.shape.end());
  };
  auto fits = [&](const ArrayLoader::Array &a, int lead) {
    return int(a.type.shape.size()) >= lead &&
           sampleOf(a.fileType()) ==
               std::vector<int64_t>(a.type.shape.begin() + lead,
                                    a.type.shape.end());
  };
  bool micro = true, shaped = false;
  for (const ArrayLoader::Array &a : arrays) {
    micro = micro && !fits(a, 1) && fits(a, 2);
    shaped = shaped || a.type.shape.size() > 2;
  }
  micro = micro && shaped;
  for (ArrayLoader::Array &a : arrays) {
    const TensorType &dataType = a.fileType();
    std::string what = a.name + "=" + a.file + ": ";
    a.lead = micro ? 2 : 1;
    if (!fits(a, a.lead)) {
      TensorType want{a.type.dtype, sampleOf(a.type)};
      return Status::error(what + "expected N samples of " + want.str() +
                           " (input '" + a.name + "' is " + a.type.str() +
                           "), got " + dataType.str());
    }
    if (dataType.dtype != a.type.dtype) {
      bool intToInt = isInteger(dataType.dtype) && isInteger(a.type.dtype);
      bool toBf16 = dataType.dtype == DType::F32 && a.type.dtype == DType::BF16;
      bool toF16 = dataType.dtype == DType::F32 && a.type.dtype == DType::F16;
      if (!intToInt && !toBf16 && !toF16)
        return Status::error(what + "input '" + a.name + "' is " +
                             dtypeName(a.type.dtype) + ", the array holds " +
                             dtypeName(dataType.dtype));
      // This process checks its share of the elements.
      if (intToInt && a.type.dtype == DType::I32 &&
          dataType.dtype == DType::I64) {
        auto [lo, hi] = shareRange(uint64_t(dataType.numElements()), share);
        for (uint64_t i = lo; i < hi; ++i) {
          int64_t v;
          std::memcpy(&v, a.samples() + 8 * i, 8);
          if (v < std::numeric_limits<int32_t>::min() ||
              v > std::numeric_limits<int32_t>::max())
            return Status::error(what + "element " + std::to_string(i) +
                                 " does not fit the input's i32");
        }
      }
    }
    int64_t rows = a.type.shape[0] * (micro ? a.type.shape[1] : 1);
    if (samples < 0) {
      samples = dataType.shape[0];
      batch = rows;
      first = a.name;
    } else if (dataType.shape[0] != samples) {
      return Status::error(what + std::to_string(dataType.shape[0]) +
                           " samples, but '" + first + "' has " +
                           std::to_string(samples));
    } else if (rows != batch) {
      return Status::error(what + "input '" + a.name + "' takes " +
                           std::to_string(rows) + " samples a batch, but '" +
                           first + "' takes " + std::to_string(batch));
    }
  }
  if (batch < 1 || samples < batch)
    return Status::error("the arrays hold " + std::to_string(samples) +
                         " samples, fewer than one batch (" +
                         std::to_string(batch) + ")");
  return std::unique_ptr<DataLoader>(
      new ArrayLoader(std::move(arrays), samples, batch, shuffle));
}

static Expected<std::unique_ptr<DataLoader>>
createSyntheticLoaderImpl(const Executable &exe,
                      const std::vector<std::string> &inputNames,
                      int64_t vocab) {
  std::vector<SyntheticLoader::Input> inputs;
  for (const std::string &name : inputNames) {
    int32_t id = -1;
    uint64_t position = 0;
    for (size_t i = 0; i < exe.inputs.size(); ++i)
      if (exe.values[exe.inputs[i]].name == name) {
        id = exe.inputs[i];
        position = i;
      }
    if (id < 0)
      return Status::error("the model has no input '" + name + "'");
    const TensorType &type = exe.values[id].type;
    int64_t range = 0;
    if (isInteger(type.dtype)) {
      std::optional<int64_t> r = inferIntRange(exe, id);
      range = r ? *r : vocab;
      if (range < 1)
        return Status::error(
            "cannot tell which values the int input '" + name + "' (" +
            type.str() +
            ") takes: no gather or cross_entropy reads it; pass --vocab V for "
            "values in [0, V), or give data");
    }
    inputs.push_back({name, type, position, range});
  }
  return std::unique_ptr<DataLoader>(new SyntheticLoader(std::move(inputs)));
}

// The public entry points: nothing throws across them (a huge file can
// exhaust memory).
Expected<std::unique_ptr<DataLoader>>
createTokenLoader(const Executable &exe, const std::string &path,
                  TokenDType rawDType, DataShare share) {
  try {
    return createTokenLoaderImpl(exe, path, rawDType, share);
  } catch (const std::exception &e) {
    return Status::error(path + ": " + e.what());
  }
}

Expected<std::unique_ptr<DataLoader>> createArrayLoader(
    const Executable &exe,
    const std::vector<std::pair<std::string, std::string>> &files,
    bool shuffle, DataShare share) {
  try {
    return createArrayLoaderImpl(exe, files, shuffle, share);
  } catch (const std::exception &e) {
    return Status::error(std::string("loading arrays: ") + e.what());
  }
}

Expected<std::unique_ptr<DataLoader>>
createSyntheticLoader(const Executable &exe,
                      const std::vector<std::string> &inputNames,
                      int64_t vocab) {
  try {
    return createSyntheticLoaderImpl(exe, inputNames, vocab);
  } catch (const std::exception &e) {
    return Status::error(std::string("synthetic data: ") + e.what());
  }
}

} // namespace dlopt::rt
