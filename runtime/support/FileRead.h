//===- FileRead.h - Bounded whole-file reads ------------------------------===//
//
// Every file dlopt reads whole goes through readFileLimited, which
//   - refuses directories with that word (not "invalid JSON" or "empty");
//   - checks a regular file's size against the caller's limit before
//     allocating anything;
//   - reads pipes and devices (/dev/zero, process substitution) in chunks,
//     checks the leading bytes as soon as they arrive (a bad magic ends the
//     read at once) and stops at the limit, so an endless stream is refused
//     instead of read until memory runs out.
// Header-only: the runtime and the planner share it without a library.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/support/Status.h"

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fcntl.h>
#include <functional>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

namespace dlopt::rt {

inline constexpr uint64_t kKiB = 1024, kMiB = kKiB * 1024, kGiB = kMiB * 1024;

/// Text inputs (cluster, plan, calibration files): far above any real one.
inline constexpr uint64_t kMaxTextFileBytes = 64 * kMiB;

/// Streams (pipes, devices) are read up to this much whatever the caller's
/// limit, since their size is unknown until the end.
inline constexpr uint64_t kMaxStreamBytes = 1 * kGiB;

inline std::string formatBytes(uint64_t n) {
  if (n >= kGiB && n % kGiB == 0)
    return std::to_string(n / kGiB) + " GiB";
  if (n >= kMiB && n % kMiB == 0)
    return std::to_string(n / kMiB) + " MiB";
  return std::to_string(n) + " bytes";
}

/// Checks the first bytes of a file as soon as `prefixLen` of them (or the
/// whole file, if shorter) have been read.
struct PrefixCheck {
  size_t prefixLen = 0;
  std::function<Status(const uint8_t *, size_t)> check;
};

/// Reads `path` whole. `what` names the file's role in messages ("plan
/// file", "cluster file"). Messages start with the path.
inline Expected<std::vector<uint8_t>>
readFileLimited(const std::string &path, const std::string &what,
                uint64_t maxBytes, const PrefixCheck &prefix = {}) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return Status::error(path + ": " +
                         (what == "file" ? "" : "cannot open " + what + ": ") +
                         std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0)
    return Status::error(path + ": " + std::strerror(errno));
  if (S_ISDIR(st.st_mode))
    return Status::error(path + ": is a directory, expected a " + what);
  bool regular = S_ISREG(st.st_mode);
  uint64_t limit = regular ? maxBytes : std::min(maxBytes, kMaxStreamBytes);
  if (regular && uint64_t(st.st_size) > limit)
    return Status::error(path + ": the " + what + " is " +
                         std::to_string(st.st_size) + " bytes, more than " +
                         formatBytes(limit) + " allowed");
  std::vector<uint8_t> bytes;
  try {
    if (regular)
      bytes.reserve(size_t(st.st_size));
    bool prefixChecked = !prefix.check;
    uint8_t buf[1 << 16];
    for (;;) {
      ssize_t n = ::read(fd, buf, sizeof(buf));
      if (n < 0) {
        if (errno == EINTR)
          continue;
        return Status::error(path + ": read failed: " + std::strerror(errno));
      }
      if (n == 0)
        break;
      if (bytes.size() + uint64_t(n) > limit)
        return Status::error(
            path + ": the " + what + " is larger than " + formatBytes(limit) +
            (regular ? std::string(" (it grew while being read)")
                     : std::string(" (it is not a regular file: a device or "
                                   "an endless stream?)")));
      bytes.insert(bytes.end(), buf, buf + n);
      if (!prefixChecked && bytes.size() >= prefix.prefixLen) {
        prefixChecked = true;
        Status s = prefix.check(bytes.data(), bytes.size());
        if (!s)
          return s.withContext(path + ": ");
      }
    }
    if (!prefixChecked) {
      Status s = prefix.check(bytes.data(), bytes.size());
      if (!s)
        return s.withContext(path + ": ");
    }
  } catch (const std::exception &e) {
    return Status::error(path + ": " + e.what());
  }
  return bytes;
}

/// The same for text files.
inline Expected<std::string> readTextFileLimited(const std::string &path,
                                                 const std::string &what,
                                                 uint64_t maxBytes =
                                                     kMaxTextFileBytes) {
  Expected<std::vector<uint8_t>> b = readFileLimited(path, what, maxBytes);
  if (!b)
    return b.status();
  return std::string(b->begin(), b->end());
}

} // namespace dlopt::rt
