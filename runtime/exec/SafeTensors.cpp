//===- SafeTensors.cpp - The safetensors file format ----------------------===//
//
// nlohmann::json throws; every call is wrapped so nothing escapes this file.
//
//===----------------------------------------------------------------------===//

#include "runtime/exec/SafeTensors.h"
#include "runtime/exec/Npy.h"

#include "runtime/support/JsonLimits.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <csignal>
#include <fcntl.h>
#include <filesystem>
#include <optional>
#include <sys/stat.h>
#include <unistd.h>

namespace dlopt::rt {

namespace {

using Json = nlohmann::ordered_json;

/// Sizes beyond this are rejected so offset arithmetic cannot overflow.
constexpr uint64_t kMaxBytes = uint64_t(1) << 48;

std::optional<DType> dtypeFromSafeTensors(const std::string &s) {
  if (s == "F32") return DType::F32;
  if (s == "F16") return DType::F16;
  if (s == "BF16") return DType::BF16;
  if (s == "I32") return DType::I32;
  if (s == "I64") return DType::I64;
  if (s == "BOOL") return DType::I1;
  return std::nullopt;
}

struct Entry {
  std::string name;
  TensorType type;
  uint64_t begin = 0, end = 0;
};

/// Reads the tensor table and metadata from the header JSON, checking
/// every field; errors name the tensor.
Status parseHeader(const Json &doc, uint64_t dataSize, std::vector<Entry> &out,
                   std::map<std::string, std::string> &metadata) {
  if (!doc.is_object())
    return Status::error(std::string("header: expected a JSON object, got ") +
                         doc.type_name());
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string &name = it.key();
    const Json &v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object())
        return Status::error("header: __metadata__ must be an object of "
                             "strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          return Status::error("header: __metadata__." + m.key() +
                               " must be a string, got " +
                               m.value().type_name());
        metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    // The writer refuses these names too, so every file read can be
    // written back (the safetensors fuzz target's round trip).
    if (name.empty())
      return Status::error("header: a tensor has an empty name");
    std::string where = "tensor '" + name + "': ";
    if (!v.is_object())
      return Status::error(where + "expected an object");
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || sh == v.end() || off == v.end())
      return Status::error(where + "needs dtype, shape and data_offsets");
    if (!dt->is_string())
      return Status::error(where + "dtype must be a string");
    std::optional<DType> dtype = dtypeFromSafeTensors(dt->get<std::string>());
    if (!dtype)
      return Status::error(where + "dtype '" + dt->get<std::string>() +
                           "' is not supported (supported: F32, F16, BF16, "
                           "I32, I64, BOOL)");
    Entry e;
    e.name = name;
    e.type.dtype = *dtype;
    if (!sh->is_array())
      return Status::error(where + "shape must be an array");
    uint64_t bytes = uint64_t(dtypeSize(*dtype));
    for (const Json &d : *sh) {
      if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0))
        return Status::error(where + "shape must hold non-negative integers");
      uint64_t dim = d.get<uint64_t>();
      if (dim > kMaxBytes || (dim != 0 && bytes > kMaxBytes / dim))
        return Status::error(where + "shape is too large");
      bytes *= dim;
      e.type.shape.push_back(int64_t(dim));
    }
    if (!off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned())
      return Status::error(where + "data_offsets must be [BEGIN, END] with "
                                   "non-negative integers");
    e.begin = (*off)[0].get<uint64_t>();
    e.end = (*off)[1].get<uint64_t>();
    if (e.begin > e.end || e.end > dataSize)
      return Status::error(where + "data_offsets [" + std::to_string(e.begin) +
                           ", " + std::to_string(e.end) +
                           "] lie outside the data (" +
                           std::to_string(dataSize) + " bytes)");
    if (e.end - e.begin != bytes)
      return Status::error(where + "data_offsets [" + std::to_string(e.begin) +
                           ", " + std::to_string(e.end) + "] hold " +
                           std::to_string(e.end - e.begin) + " bytes, " +
                           e.type.str() + " needs " + std::to_string(bytes));
    out.push_back(std::move(e));
  }
  // The tensors must tile the data exactly.
  std::stable_sort(out.begin(), out.end(), [](const Entry &a, const Entry &b) {
    return a.begin < b.begin || (a.begin == b.begin && a.end < b.end);
  });
  uint64_t pos = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].begin < pos)
      return Status::error("tensor '" + out[i].name + "': data_offsets [" +
                           std::to_string(out[i].begin) + ", " +
                           std::to_string(out[i].end) + "] overlap tensor '" +
                           out[i - 1].name + "'");
    if (out[i].begin > pos)
      return Status::error("data bytes [" + std::to_string(pos) + ", " +
                           std::to_string(out[i].begin) +
                           ") belong to no tensor");
    pos = out[i].end;
  }
  if (pos != dataSize)
    return Status::error("data bytes [" + std::to_string(pos) + ", " +
                         std::to_string(dataSize) + ") belong to no tensor");
  return Status::ok();
}

Expected<SafeTensorsFile> parseImpl(const std::vector<uint8_t> &bytes) {
  if (bytes.size() < 8)
    return Status::error("truncated: " + std::to_string(bytes.size()) +
                         " bytes, a safetensors file starts with an 8-byte "
                         "header length");
  uint64_t headerLen = 0;
  for (int i = 0; i < 8; ++i)
    headerLen |= uint64_t(bytes[i]) << (8 * i);
  uint64_t rest = bytes.size() - 8;
  if (headerLen > rest)
    return Status::error("truncated or corrupt: header length " +
                         std::to_string(headerLen) + " exceeds the " +
                         std::to_string(rest) + " bytes after it");
  const char *begin = reinterpret_cast<const char *>(bytes.data() + 8);
  Expected<Json> parsed = parseJsonBounded<Json>(begin, begin + headerLen);
  if (!parsed)
    return Status::error("malformed header JSON: " +
                         parsed.status().message());
  Json doc = parsed.take();
  uint64_t dataSize = rest - headerLen;
  std::vector<Entry> entries;
  SafeTensorsFile file;
  DLOPT_RETURN_IF_ERROR(parseHeader(doc, dataSize, entries, file.metadata));
  const uint8_t *data = bytes.data() + 8 + headerLen;
  for (const Entry &e : entries) {
    NamedTensor t;
    t.name = e.name;
    t.tensor.type = e.type;
    t.tensor.bytes.assign(data + e.begin, data + e.end);
    if (e.type.dtype == DType::I1)
      for (uint8_t b : t.tensor.bytes)
        if (b > 1)
          return Status::error("tensor '" + e.name +
                               "': BOOL data holds a byte other than 0 or 1");
    file.tensors.push_back(std::move(t));
  }
  return file;
}

} // namespace

const char *safeTensorsDType(DType dtype) {
  switch (dtype) {
  case DType::F32: return "F32";
  case DType::F16: return "F16";
  case DType::BF16: return "BF16";
  case DType::I32: return "I32";
  case DType::I64: return "I64";
  case DType::I1: return "BOOL";
  }
  return "?";
}

const HostTensor *SafeTensorsFile::find(const std::string &name) const {
  for (const NamedTensor &t : tensors)
    if (t.name == name)
      return &t.tensor;
  return nullptr;
}

namespace {

/// The 8-byte length and the padded JSON header of a file of `tensors`;
/// *dataBytes gets the data's size.
Expected<std::string>
encodeHeader(const std::vector<TensorView> &tensors,
             const std::map<std::string, std::string> &metadata,
             uint64_t *dataBytes) {
  try {
    Json header = Json::object();
    if (!metadata.empty()) {
      Json meta = Json::object();
      for (const auto &[k, v] : metadata)
        meta[k] = v;
      header["__metadata__"] = std::move(meta);
    }
    uint64_t offset = 0;
    for (const TensorView &t : tensors) {
      if (t.name.empty() || t.name == "__metadata__")
        return Status::error("invalid tensor name '" + t.name + "'");
      if (header.contains(t.name))
        return Status::error("tensor '" + t.name + "' given twice");
      uint64_t bytes = uint64_t(t.type.byteSize());
      Json e = Json::object();
      e["dtype"] = safeTensorsDType(t.type.dtype);
      e["shape"] = t.type.shape;
      e["data_offsets"] = {offset, offset + bytes};
      offset += bytes;
      header[t.name] = std::move(e);
    }
    std::string text = header.dump();
    // Pad with spaces so the data starts 8-byte aligned, as the reference
    // writer does.
    text.append((8 - text.size() % 8) % 8, ' ');
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i)
      out[size_t(i)] = char(uint8_t(uint64_t(text.size()) >> (8 * i)));
    *dataBytes = offset;
    return out + text;
  } catch (const std::exception &e) {
    return Status::error(std::string("encoding safetensors: ") + e.what());
  }
}

/// Writes the chunks, in order, to `path` atomically (see writeFileAtomic).
Status writeChunksAtomic(const std::string &path,
                         const std::vector<std::pair<const void *, size_t>> &chunks);

/// Views of `tensors`, each checked to hold as many bytes as its type.
Expected<std::vector<TensorView>> viewsOf(const std::vector<NamedTensor> &tensors) {
  std::vector<TensorView> views;
  for (const NamedTensor &t : tensors) {
    if (int64_t(t.tensor.bytes.size()) != t.tensor.type.byteSize())
      return Status::error("tensor '" + t.name + "' holds " +
                           std::to_string(t.tensor.bytes.size()) + " bytes, " +
                           t.tensor.type.str() + " needs " +
                           std::to_string(t.tensor.type.byteSize()));
    views.push_back({t.name, t.tensor.type, t.tensor.bytes.data()});
  }
  return views;
}

} // namespace

Expected<std::vector<uint8_t>>
encodeSafeTensors(const std::vector<NamedTensor> &tensors,
                  const std::map<std::string, std::string> &metadata) {
  Expected<std::vector<TensorView>> views = viewsOf(tensors);
  if (!views)
    return views.status();
  uint64_t data = 0;
  Expected<std::string> head = encodeHeader(*views, metadata, &data);
  if (!head)
    return head.status();
  std::vector<uint8_t> out;
  out.reserve(head->size() + data);
  out.insert(out.end(), head->begin(), head->end());
  for (const NamedTensor &t : tensors)
    out.insert(out.end(), t.tensor.bytes.begin(), t.tensor.bytes.end());
  return out;
}

Status writeSafeTensorsAtomic(const std::string &path,
                              const std::vector<NamedTensor> &tensors,
                              const std::map<std::string, std::string> &metadata,
                              uint64_t *fileBytes) {
  Expected<std::vector<TensorView>> views = viewsOf(tensors);
  if (!views)
    return views.status().withContext(path + ": ");
  return writeSafeTensorsAtomic(path, *views, metadata, fileBytes);
}

Status writeSafeTensorsAtomic(const std::string &path,
                              const std::vector<TensorView> &tensors,
                              const std::map<std::string, std::string> &metadata,
                              uint64_t *fileBytes) {
  uint64_t data = 0;
  Expected<std::string> head = encodeHeader(tensors, metadata, &data);
  if (!head)
    return head.status().withContext(path + ": ");
  std::vector<std::pair<const void *, size_t>> chunks;
  chunks.push_back({head->data(), head->size()});
  for (const TensorView &t : tensors)
    chunks.push_back({t.data, size_t(t.type.byteSize())});
  if (fileBytes)
    *fileBytes = head->size() + data;
  return writeChunksAtomic(path, chunks);
}

const SafeTensorsTable::Entry *
SafeTensorsTable::find(const std::string &name) const {
  for (const Entry &e : entries)
    if (e.name == name)
      return &e;
  return nullptr;
}

namespace {
/// Reads exactly n bytes at offset `at`; false on an error or end of file.
bool preadAll(int fd, void *dst, size_t n, uint64_t at) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(fd, static_cast<char *>(dst) + done, n - done,
                        off_t(at + done));
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return false;
    done += size_t(r);
  }
  return true;
}
} // namespace

Expected<SafeTensorsTable> readSafeTensorsTable(const std::string &path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return Status::error(path + ": " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0)
    return Status::error(path + ": " + std::strerror(errno));
  const uint64_t size = uint64_t(st.st_size);
  if (size < 8)
    return Status::error(path + ": truncated: " + std::to_string(size) +
                         " bytes, a safetensors file starts with an 8-byte "
                         "header length");
  uint8_t lenBytes[8];
  if (!preadAll(fd, lenBytes, 8, 0))
    return Status::error(path + ": cannot read the header length");
  uint64_t headerLen = 0;
  for (int i = 0; i < 8; ++i)
    headerLen |= uint64_t(lenBytes[i]) << (8 * i);
  if (headerLen > size - 8 || headerLen > (uint64_t(1) << 30))
    return Status::error(path + ": truncated or corrupt: header length " +
                         std::to_string(headerLen) + " exceeds the " +
                         std::to_string(size - 8) + " bytes after it");
  std::string text(size_t(headerLen), '\0');
  if (!preadAll(fd, text.data(), text.size(), 8))
    return Status::error(path + ": cannot read the header");
  try {
    Expected<Json> parsed =
        parseJsonBounded<Json>(text.data(), text.data() + text.size());
    if (!parsed)
      return Status::error(path + ": malformed header JSON: " +
                           parsed.status().message());
    std::vector<Entry> entries;
    SafeTensorsTable table;
    DLOPT_RETURN_IF_ERROR(
        parseHeader(*parsed, size - 8 - headerLen, entries, table.metadata)
            .withContext(path + ": "));
    for (const Entry &e : entries)
      table.entries.push_back(
          {e.name, e.type, 8 + headerLen + e.begin, e.end - e.begin});
    return table;
  } catch (const std::exception &e) {
    return Status::error(path + ": reading safetensors: " + e.what());
  }
}

Status readSafeTensorsEntry(const std::string &path,
                            const SafeTensorsTable::Entry &e, void *out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return Status::error(path + ": " + std::strerror(errno));
  bool read = preadAll(fd, out, size_t(e.bytes), e.offset);
  ::close(fd);
  if (!read)
    return Status::error(path + ": tensor '" + e.name +
                         "': cannot read its bytes (truncated?)");
  if (e.type.dtype == DType::I1)
    for (size_t i = 0; i < e.bytes; ++i)
      if (static_cast<const uint8_t *>(out)[i] > 1)
        return Status::error(path + ": tensor '" + e.name +
                             "': BOOL data holds a byte other than 0 or 1");
  return Status::ok();
}

Expected<SafeTensorsFile> parseSafeTensors(const std::vector<uint8_t> &bytes) {
  try {
    return parseImpl(bytes);
  } catch (const std::exception &e) {
    return Status::error(std::string("reading safetensors: ") + e.what());
  }
}

Expected<SafeTensorsFile> readSafeTensors(const std::string &path) {
  Expected<std::vector<uint8_t>> bytes = readFileBytes(path);
  if (!bytes)
    return bytes.status();
  Expected<SafeTensorsFile> f = parseSafeTensors(*bytes);
  if (!f)
    return f.status().withContext(path + ": ");
  return f;
}

namespace {

/// This host's name with dots replaced, so it parses back out of a file
/// name; "localhost" if it has none.
std::string hostName() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == 0)
    return "localhost";
  std::string s(buf);
  for (char &c : s)
    if (c == '.' || c == '/')
      c = '_';
  return s;
}

} // namespace

std::vector<std::string> removeStaleTempFiles(const std::string &dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> removed;
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  if (ec)
    return removed;
  const std::string host = "." + hostName() + ".";
  for (; it != end; it.increment(ec)) {
    if (ec)
      break;
    std::string name = it->path().filename().string();
    // .NAME.tmp.HOST.PID
    size_t tmpAt = name.rfind(".tmp" + host);
    if (name.empty() || name[0] != '.' || tmpAt == std::string::npos)
      continue;
    std::string pidText = name.substr(tmpAt + 4 + host.size());
    if (pidText.empty() || pidText.size() > 9 ||
        pidText.find_first_not_of("0123456789") != std::string::npos)
      continue;
    pid_t pid = pid_t(std::stol(pidText));
    if (pid == ::getpid() || (::kill(pid, 0) == 0 || errno == EPERM))
      continue; // its writer still runs
    if (fs::remove(it->path(), ec))
      removed.push_back(name);
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

Status writeFileAtomic(const std::string &path,
                       const std::vector<uint8_t> &bytes) {
  return writeChunksAtomic(path, {{bytes.data(), bytes.size()}});
}

namespace {
Status writeChunksAtomic(
    const std::string &path,
    const std::vector<std::pair<const void *, size_t>> &chunks) {
  namespace fs = std::filesystem;
  fs::path target(path);
  fs::path dir = target.parent_path();
  if (dir.empty())
    dir = ".";
  std::string tmp = (dir / ("." + target.filename().string() + ".tmp." +
                            hostName() + "." + std::to_string(::getpid())))
                        .string();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return Status::error(path + ": cannot create '" + tmp +
                         "': " + std::strerror(errno));
  auto failWith = [&](const std::string &what) {
    int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return Status::error(path + ": " + what + ": " + std::strerror(err));
  };
  for (const auto &[data, size] : chunks) {
    size_t done = 0;
    while (done < size) {
      ssize_t n = ::write(fd, static_cast<const char *>(data) + done,
                          size - done);
      if (n < 0) {
        if (errno == EINTR)
          continue;
        return failWith("write failed");
      }
      done += size_t(n);
    }
  }
  if (::fsync(fd) != 0)
    return failWith("fsync failed");
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return Status::error(path + ": close failed: " + std::strerror(err));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return Status::error(path + ": cannot rename the temporary file: " +
                         std::strerror(err));
  }
  // Make the rename itself durable.
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return Status::ok();
}

} // namespace

} // namespace dlopt::rt
