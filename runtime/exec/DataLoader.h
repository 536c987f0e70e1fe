//===- DataLoader.h - Batches for training and evaluation loops -----------===//
//
// A DataLoader turns a data set into the tensors one step binds. Batch
// `index` counts batches from the start of training across epochs, and a
// batch is a pure function of the loader's data, the data seed and the
// index: the only state a checkpoint needs is the index (the "data
// position") and the seed, and a resumed run sees exactly the batches the
// uninterrupted run would have seen.
//
// Three loaders (docs/training-runtime.md):
//  - token streams for language models: consecutive windows of seq+1 tokens
//    (stride seq), tokens = w[:-1], labels = w[1:];
//  - arrays (.npy) sliced along dim 0, reshuffled every epoch;
//  - synthetic data from a counter-based generator.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/exec/GlobalTensor.h"
#include "runtime/exec/HostTensor.h"
#include "runtime/format/Executable.h"
#include "runtime/support/Status.h"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dlopt::rt {

/// Which part of a data set's load-time checks this process makes: part
/// `index` of `count` (the caller combines the processes' results).
struct DataShare {
  int index = 0, count = 1;
};

class DataLoader {
public:
  virtual ~DataLoader() = default;
  /// Makes batch() fill only the elements of input `input` inside `box` (the
  /// part this process's ranks read; see StepRunner::inputRegion) and leave
  /// the rest zero, reading no data outside it. Batches are otherwise
  /// unchanged: the elements inside are those of the unrestricted batch.
  void restrictTo(const std::string &input, Box box) {
    regions_[input] = std::move(box);
  }
  /// The box of `input` set by restrictTo, or null (the whole tensor).
  const Box *region(const std::string &input) const {
    auto it = regions_.find(input);
    return it == regions_.end() ? nullptr : &it->second;
  }
  /// The tensors of batch `index` (one per input this loader feeds, each of
  /// the input's exact type). `seed` drives shuffling and synthetic values.
  virtual Expected<std::vector<NamedTensor>> batch(uint64_t index,
                                                   uint64_t seed) const = 0;
  /// Names of the inputs the batches bind.
  virtual std::vector<std::string> inputs() const = 0;
  /// Whole batches in one pass over the data; 0 for endless synthetic data.
  virtual uint64_t batchesPerEpoch() const = 0;
  /// The epoch batch `index` falls in (0 for synthetic data).
  virtual uint64_t epochOf(uint64_t index) const = 0;
  /// "synthetic", "tokens:FILE", "arrays:images=a.npy,labels=b.npy".
  virtual std::string describe() const = 0;

private:
  std::map<std::string, Box> regions_;
};

/// Element type of a raw (headerless) token file.
enum class TokenDType { U16, I32 };

/// Language-model data: a token stream read from `path` (a .npy array of
/// integers of any shape, read flat, or raw little-endian `rawDType`
/// values) feeding the `tokens` input [B, S] and, if the model has it, the
/// `labels` input of the same shape. Window j holds tokens [j*S, j*S+S+1);
/// batch b takes windows (b*B + r) mod numWindows for rows r. Tokens are
/// checked against the vocabulary (see inferIntRange) when it is known;
/// with a `share`, only that part of the file is checked at load, the rest
/// being the other processes' (a regular file is mapped, not read: a
/// process reads the windows its batches use and its share of the check).
Expected<std::unique_ptr<DataLoader>>
createTokenLoader(const Executable &exe, const std::string &path,
                  TokenDType rawDType, DataShare share = {});

/// The token ids of a token file's bytes: a .npy array of integers (any
/// shape, C or Fortran order, read flat in C order) or, without the .npy
/// magic, raw little-endian `rawDType` values. Ids must fit int32 and be
/// >= 0; the vocabulary is checked by createTokenLoader.
Expected<std::vector<int32_t>> decodeTokenFile(const std::vector<uint8_t> &bytes,
                                               TokenDType rawDType);

/// Classifier-style data: `files` maps inputs to .npy arrays whose dim 0
/// indexes samples (all arrays the same length N, each sample shaped like
/// the input without its batch dim). Batch k of an epoch holds samples
/// perm[k*B, (k+1)*B), with perm a fresh permutation per epoch when
/// `shuffle` (else the identity); the last N mod B samples of an epoch are
/// dropped. Integer arrays are converted to the input's integer type, and
/// f32 arrays to bf16/f16 inputs, one batch at a time. Regular C-order
/// files are mapped, so a process reads only the samples of its batches
/// (and, with a `share`, its part of the load-time range checks).
Expected<std::unique_ptr<DataLoader>> createArrayLoader(
    const Executable &exe,
    const std::vector<std::pair<std::string, std::string>> &files,
    bool shuffle, DataShare share = {});

/// Synthetic data for `inputNames`: uniform ints in [0, V) for int inputs
/// (V from inferIntRange, else `vocab`), 0/1 for i1, standard normals for
/// floats. Errors when an int input has no known range and `vocab` is 0.
Expected<std::unique_ptr<DataLoader>>
createSyntheticLoader(const Executable &exe,
                      const std::vector<std::string> &inputNames,
                      int64_t vocab);

/// The number of values an int input can take without making the program
/// fail: the table rows of a gather that reads it as ids (or the rows of a
/// scatter_add), or the class count C of a cross_entropy that reads it as
/// labels, following value-preserving ops (reshape, transpose, slice,
/// broadcast_to, concat, cast) in between; the smallest if several.
std::optional<int64_t> inferIntRange(const Executable &exe, int32_t inputId);

/// A synthetic float input's element from its generator word: the standard
/// normal quantile at u = (k + 1/2) / 2^24, k the word's top 24 bits
/// (Giles' single-precision erfinv on a log of our own, within 2e-6 of the
/// exact quantile; |z| <= 5.4), in IEEE float arithmetic without libm, so
/// the same bits on every machine. One word per element.
float syntheticNormal(uint64_t word);
/// out[j] = syntheticNormal(word(key, first + j)) for j in [0, n), eight
/// lanes at a time (the same bits as one at a time).
void syntheticNormals(uint64_t key, uint64_t first, int64_t n, float *out);

/// Element `n` of the data generator's stream `key` (splitmix64, as in
/// ParamInit.h); exposed for tests and docs.
uint64_t dataKey(uint64_t seed, uint64_t stream, uint64_t index);

/// A permutation of [0, n) drawn with Fisher-Yates from stream `key`.
std::vector<uint64_t> shuffledIndices(uint64_t n, uint64_t key);

} // namespace dlopt::rt
