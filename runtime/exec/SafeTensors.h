//===- SafeTensors.h - The safetensors file format ------------------------===//
//
// Checkpoints are safetensors files (https://github.com/huggingface/
// safetensors), written and read here without the reference library:
//
//   u64 LE  N           length of the header
//   N bytes header      JSON: {"__metadata__": {str: str, ...},
//                              NAME: {"dtype": "F32", "shape": [2, 3],
//                                     "data_offsets": [BEGIN, END]}, ...}
//                       padded with spaces to a multiple of 8 bytes
//   data                every tensor's bytes, little-endian, row-major;
//                       offsets are relative to the start of the data, and
//                       the tensors cover it exactly (no holes, no overlap)
//
// dtypes: F32, F16, BF16, I32, I64, BOOL (i1, one byte 0/1). The parser
// assumes nothing about its input: every length and offset is checked
// against the file before it is used, so a truncated or corrupt file gets a
// message, never a crash.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/exec/HostTensor.h"
#include "runtime/support/Status.h"

#include <map>
#include <string>
#include <vector>

namespace dlopt::rt {

struct SafeTensorsFile {
  std::vector<NamedTensor> tensors; ///< in order of their data offsets
  std::map<std::string, std::string> metadata; ///< "__metadata__"

  /// The tensor named `name`, or null.
  const HostTensor *find(const std::string &name) const;
};

/// Encodes tensors (data in the given order) and metadata. Names must be
/// unique, non-empty, and not "__metadata__".
Expected<std::vector<uint8_t>>
encodeSafeTensors(const std::vector<NamedTensor> &tensors,
                  const std::map<std::string, std::string> &metadata);

/// Writes tensors and metadata to `path` atomically (as writeFileAtomic)
/// without assembling the file in memory; *fileBytes gets its size.
Status writeSafeTensorsAtomic(const std::string &path,
                              const std::vector<NamedTensor> &tensors,
                              const std::map<std::string, std::string> &metadata,
                              uint64_t *fileBytes = nullptr);

/// A tensor's bytes where they already are (e.g. in a CPU arena).
struct TensorView {
  std::string name;
  TensorType type;
  const void *data = nullptr; ///< type.byteSize() bytes
};

/// The same, writing each tensor's bytes straight from where they are.
Status writeSafeTensorsAtomic(const std::string &path,
                              const std::vector<TensorView> &tensors,
                              const std::map<std::string, std::string> &metadata,
                              uint64_t *fileBytes = nullptr);

/// A file's tensor table, read and checked without reading the data: the
/// header is checked as parseSafeTensors checks it, against the file's size.
struct SafeTensorsTable {
  struct Entry {
    std::string name;
    TensorType type;
    uint64_t offset = 0; ///< of the tensor's bytes from the file's start
    uint64_t bytes = 0;
  };
  std::vector<Entry> entries; ///< in order of their data offsets
  std::map<std::string, std::string> metadata;
  const Entry *find(const std::string &name) const;
};
Expected<SafeTensorsTable> readSafeTensorsTable(const std::string &path);
/// Reads one entry's bytes (e.bytes of them) into `out` (BOOL data checked).
Status readSafeTensorsEntry(const std::string &path,
                            const SafeTensorsTable::Entry &e, void *out);

/// Parses and checks a whole file's bytes.
Expected<SafeTensorsFile> parseSafeTensors(const std::vector<uint8_t> &bytes);

/// File versions; errors are "PATH: reason".
Expected<SafeTensorsFile> readSafeTensors(const std::string &path);

/// Writes `bytes` to `path` atomically: a temporary file in the same
/// directory (`.NAME.tmp.HOST.PID`), fsync, rename over `path`, fsync of
/// the directory. A crash leaves either the old file or the new one, never
/// a partial file; the temporary file of a killed writer is removed by
/// removeStaleTempFiles.
/// Removes the temporary files writeFileAtomic left in `dir` when its
/// process was killed: those of this host whose process no longer runs
/// (files of other hosts, on a shared file system, are left to them).
/// Returns the names removed.
std::vector<std::string> removeStaleTempFiles(const std::string &dir);

Status writeFileAtomic(const std::string &path,
                       const std::vector<uint8_t> &bytes);

/// safetensors spelling of a dtype ("F32", "BF16", "BOOL", ...).
const char *safeTensorsDType(DType dtype);

} // namespace dlopt::rt
