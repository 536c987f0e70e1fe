//===- Npy.h - NumPy .npy tensor files ------------------------------------===//
//
// Reads and writes the NumPy format (versions 1.0, 2.0 and 3.0), C order,
// little-endian. dtype mapping: '<f4' f32, '<f2' f16, '<i4' i32, '<i8' i64,
// '|b1' i1; '|u1' is read as i1 when every byte is 0 or 1. bf16 has no NumPy
// dtype: it is written as '<f4' (exact), and Session::bind accepts f32 data
// for a bf16 value by rounding to nearest even.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/exec/HostTensor.h"
#include "runtime/support/FileRead.h"
#include "runtime/support/Status.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

namespace dlopt::rt {

/// Largest data file (.npy, safetensors, token data) read whole.
inline constexpr uint64_t kMaxDataFileBytes = uint64_t(1) << 40;

/// Largest element count of a .npy array (2^48, far above any real one);
/// also keeps every byte count below 2^63.
inline constexpr int64_t kMaxNpyElements = int64_t(1) << 48;

/// The header of a .npy file, whatever its dtype: for readers of data that
/// HostTensor has no element type for (e.g. uint16 token ids).
struct NpyHeader {
  std::string descr; ///< NumPy dtype string, e.g. "<u2"
  std::vector<int64_t> shape;
  bool fortranOrder = false;
  size_t dataOffset = 0; ///< where the array data starts in the file
  int64_t numElements = 0; ///< product of `shape`, checked for overflow
};
Expected<NpyHeader> parseNpyHeader(const std::vector<uint8_t> &bytes);

/// Parses the bytes of a .npy file. Errors say what is wrong (bad magic,
/// Fortran order, unsupported dtype, truncated data, ...).
Expected<HostTensor> parseNpy(const std::vector<uint8_t> &bytes);

/// Encodes a tensor as .npy (version 1.0 unless the header needs 2.0).
std::vector<uint8_t> encodeNpy(const HostTensor &tensor);

/// A whole file; errors are "PATH: reason". Directories, files over
/// `maxBytes` and endless streams are refused (runtime/support/FileRead.h).
Expected<std::vector<uint8_t>>
readFileBytes(const std::string &path, const std::string &what = "file",
              uint64_t maxBytes = kMaxDataFileBytes);

/// File versions; messages are prefixed with the path.
Expected<HostTensor> readNpy(const std::string &path);

/// A non-empty regular file of at most `maxBytes` mapped read-only; null
/// for anything else (pipes, directories, missing files), which callers
/// read whole instead (and so report what is wrong).
class MappedFile {
public:
  static std::unique_ptr<MappedFile>
  open(const std::string &path, uint64_t maxBytes = kMaxDataFileBytes);
  ~MappedFile();
  MappedFile(const MappedFile &) = delete;
  MappedFile &operator=(const MappedFile &) = delete;

  const uint8_t *data() const { return data_; }
  size_t size() const { return size_; }
  /// A copy of its first min(size(), n) bytes (for header parsers).
  std::vector<uint8_t> head(size_t n) const {
    return std::vector<uint8_t>(data_, data_ + std::min(size_, n));
  }

private:
  MappedFile() = default;
  const uint8_t *data_ = nullptr;
  size_t size_ = 0;
};

/// A .npy file mapped read-only, for readers that take a few rows of a
/// large array: only the pages they touch are read.
class MappedNpy {
public:
  /// Maps `path` when it is a regular file holding a well-formed .npy array
  /// of a dtype readNpy maps to a DType without a scan ('|u1' is not one),
  /// in C order (or with at most one dim above 1), and exactly as many data
  /// bytes as its shape needs. Null otherwise: readNpy then reads the file
  /// whole, or says what is wrong with it.
  static std::unique_ptr<MappedNpy> tryMap(const std::string &path);

  /// dtype and shape; bool ('|b1') bytes above 1 mean true (readNpy makes
  /// them 1).
  const TensorType &type() const { return type_; }
  /// The data, C order.
  const uint8_t *data() const { return data_; }

private:
  MappedNpy() = default;
  std::unique_ptr<MappedFile> file_;
  const uint8_t *data_ = nullptr;
  TensorType type_;
};
Status writeNpy(const std::string &path, const HostTensor &tensor);

} // namespace dlopt::rt
