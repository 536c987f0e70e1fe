//===- Npy.cpp - NumPy .npy reader and writer -----------------------------===//
//
// The header is a Python dict literal; we parse exactly the subset NumPy
// writes (quoted strings, True/False, tuples of ints) instead of guessing
// with string searches, so malformed headers are reported, not misread.
//
//===----------------------------------------------------------------------===//

#include "runtime/exec/Npy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>

namespace dlopt::rt {

namespace {

constexpr char kNpyMagic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

std::string shapeText(const std::vector<int64_t> &shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

/// Parser for the header dict: {'descr': '<f4', 'fortran_order': False,
/// 'shape': (2, 3), }.
class HeaderParser {
public:
  explicit HeaderParser(const std::string &text) : s_(text) {}

  Status parse(std::string &descr, bool &fortran, std::vector<int64_t> &shape) {
    bool haveDescr = false, haveFortran = false, haveShape = false;
    skipSpace();
    if (!eat('{'))
      return err("expected '{'");
    while (true) {
      skipSpace();
      if (eat('}'))
        break;
      std::optional<std::string> key = parseString();
      if (!key)
        return err("expected a quoted key");
      skipSpace();
      if (!eat(':'))
        return err("expected ':' after '" + *key + "'");
      skipSpace();
      if ((*key == "descr" && haveDescr) ||
          (*key == "fortran_order" && haveFortran) ||
          (*key == "shape" && haveShape))
        return err("duplicate key '" + *key + "'");
      if (*key == "descr") {
        std::optional<std::string> v = parseString();
        if (!v)
          return err("'descr' must be a string");
        descr = *v;
        haveDescr = true;
      } else if (*key == "fortran_order") {
        if (s_.compare(pos_, 4, "True") == 0) {
          fortran = true;
          pos_ += 4;
        } else if (s_.compare(pos_, 5, "False") == 0) {
          fortran = false;
          pos_ += 5;
        } else {
          return err("'fortran_order' must be True or False");
        }
        haveFortran = true;
      } else if (*key == "shape") {
        Status st = parseShape(shape);
        if (!st)
          return st;
        haveShape = true;
      } else {
        return err("unexpected key '" + *key + "'");
      }
      skipSpace();
      if (eat(','))
        continue;
      skipSpace();
      if (eat('}'))
        break;
      return err("expected ',' or '}'");
    }
    skipSpace();
    if (pos_ != s_.size())
      return err("unexpected text after the dict");
    if (!haveDescr || !haveFortran || !haveShape)
      return Status::error("malformed .npy header: missing key '" +
                           std::string(!haveDescr     ? "descr"
                                       : !haveFortran ? "fortran_order"
                                                      : "shape") +
                           "'");
    return Status::ok();
  }

private:
  Status err(const std::string &what) {
    std::string shown = s_.size() > 200 ? s_.substr(0, 200) + "..." : s_;
    return Status::error("malformed .npy header: " + what + " at column " +
                         std::to_string(pos_) + " of \"" + shown + "\"");
  }
  void skipSpace() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' ||
                                s_[pos_] == '\t' || s_[pos_] == '\r'))
      ++pos_;
  }
  bool eat(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  std::optional<std::string> parseString() {
    if (pos_ >= s_.size() || (s_[pos_] != '\'' && s_[pos_] != '"'))
      return std::nullopt;
    char q = s_[pos_++];
    size_t end = s_.find(q, pos_);
    if (end == std::string::npos)
      return std::nullopt;
    std::string v = s_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return v;
  }
  Status parseShape(std::vector<int64_t> &shape) {
    shape.clear();
    if (!eat('('))
      return err("'shape' must be a tuple");
    while (true) {
      skipSpace();
      if (eat(')'))
        return Status::ok();
      size_t start = pos_;
      int64_t v = 0;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
        if (v > (int64_t(1) << 48))
          return err("dimension too large");
        v = v * 10 + (s_[pos_++] - '0');
      }
      if (pos_ == start)
        return err("expected a non-negative integer dimension");
      eat('L'); // Python 2 longs
      shape.push_back(v);
      skipSpace();
      if (eat(','))
        continue;
      skipSpace();
      if (eat(')'))
        return Status::ok();
      return err("expected ',' or ')' in 'shape'");
    }
  }

  const std::string &s_;
  size_t pos_ = 0;
};

std::optional<DType> dtypeFromDescr(const std::string &d) {
  // '=' means native order, which is little-endian on every host we run on.
  auto order = [&](char c) { return c == '<' || c == '='; };
  if (d.size() == 3 && order(d[0])) {
    std::string t = d.substr(1);
    if (t == "f4") return DType::F32;
    if (t == "f2") return DType::F16;
    if (t == "i4") return DType::I32;
    if (t == "i8") return DType::I64;
  }
  if (d == "|b1" || d == "<b1" || d == "=b1")
    return DType::I1;
  return std::nullopt;
}

const char *descrFor(DType t) {
  switch (t) {
  case DType::F32: case DType::BF16: return "<f4";
  case DType::F16: return "<f2";
  case DType::I32: return "<i4";
  case DType::I64: return "<i8";
  case DType::I1: return "|b1";
  }
  return "?";
}

} // namespace

Expected<NpyHeader> parseNpyHeader(const std::vector<uint8_t> &bytes) {
  try {
    if (bytes.size() < 10 || std::memcmp(bytes.data(), kNpyMagic, 6) != 0)
      return Status::error("not a .npy file (bad magic)");
    uint8_t major = bytes[6];
    size_t headerLen, headerStart;
    if (major == 1) {
      headerLen = size_t(bytes[8]) | size_t(bytes[9]) << 8;
      headerStart = 10;
    } else if (major == 2 || major == 3) {
      if (bytes.size() < 12)
        return Status::error("truncated .npy header");
      headerLen = size_t(bytes[8]) | size_t(bytes[9]) << 8 |
                  size_t(bytes[10]) << 16 | size_t(bytes[11]) << 24;
      headerStart = 12;
    } else {
      return Status::error("unsupported .npy format version " +
                           std::to_string(major) + "." +
                           std::to_string(bytes[7]) +
                           " (supported: 1.0, 2.0, 3.0)");
    }
    if (headerLen > (size_t(1) << 20))
      return Status::error(".npy header of " + std::to_string(headerLen) +
                           " bytes; at most 1 MiB is read");
    if (headerLen > bytes.size() - headerStart)
      return Status::error("truncated .npy header: needs " +
                           std::to_string(headerLen) + " bytes, file has " +
                           std::to_string(bytes.size() - headerStart));
    std::string header(bytes.begin() + headerStart,
                       bytes.begin() + headerStart + headerLen);
    NpyHeader h;
    DLOPT_RETURN_IF_ERROR(
        HeaderParser(header).parse(h.descr, h.fortranOrder, h.shape));
    h.dataOffset = headerStart + headerLen;
    h.numElements = 1;
    for (int64_t d : h.shape) {
      if (d < 0)
        return Status::error(".npy shape has a negative dim " +
                             std::to_string(d));
      if (d != 0 && h.numElements > kMaxNpyElements / d)
        return Status::error(".npy shape " + shapeText(h.shape) +
                             " is too large (more than 2^48 elements)");
      h.numElements *= d;
    }
    return h;
  } catch (const std::exception &e) {
    return Status::error(std::string("reading .npy: ") + e.what());
  }
}

Expected<HostTensor> parseNpy(const std::vector<uint8_t> &bytes) {
  try {
    Expected<NpyHeader> h = parseNpyHeader(bytes);
    if (!h)
      return h.status();
    const std::string &descr = h->descr;
    bool fortran = h->fortranOrder;
    const std::vector<int64_t> &shape = h->shape;

    std::optional<DType> dtype = dtypeFromDescr(descr);
    bool u8AsBool = descr == "|u1";
    if (!dtype && !u8AsBool) {
      std::string hint;
      if (!descr.empty() && descr[0] == '>')
        hint = " (big-endian data is not supported; use "
               "array.astype(array.dtype.newbyteorder('<')))";
      else if (descr == "<f8")
        hint = " (float64: save with array.astype(numpy.float32))";
      return Status::error("unsupported .npy dtype '" + descr + "'" + hint +
                           "; supported: <f4, <f2, <i4, <i8, |b1, |u1");
    }
    int nonUnitDims = 0;
    for (int64_t d : shape)
      nonUnitDims += d > 1;
    // Fortran order only changes the layout when two dims exceed 1.
    if (fortran && nonUnitDims > 1)
      return Status::error("Fortran-order .npy arrays are not supported; save "
                           "with numpy.ascontiguousarray(array)");

    HostTensor t;
    t.type.dtype = u8AsBool ? DType::I1 : *dtype;
    t.type.shape = shape;
    int64_t bytesNeeded = dtypeSize(t.type.dtype) * h->numElements;
    size_t dataStart = h->dataOffset;
    size_t have = bytes.size() - dataStart;
    if (uint64_t(bytesNeeded) != have)
      return Status::error(
          std::string(uint64_t(bytesNeeded) > have ? "truncated" : "corrupt") +
          " .npy data: shape " + t.type.str() + " needs " +
          std::to_string(bytesNeeded) + " bytes, file has " +
          std::to_string(have));
    t.bytes.assign(bytes.begin() + dataStart, bytes.end());
    if (t.type.dtype == DType::I1)
      for (uint8_t &b : t.bytes) {
        if (b > 1) {
          if (u8AsBool)
            return Status::error("uint8 .npy data can only be read as i1 when "
                                 "every element is 0 or 1");
          b = 1;
        }
      }
    return t;
  } catch (const std::exception &e) {
    return Status::error(std::string("reading .npy: ") + e.what());
  }
}

std::vector<uint8_t> encodeNpy(const HostTensor &tensor) {
  const HostTensor *src = &tensor;
  HostTensor widened;
  if (tensor.type.dtype == DType::BF16) {
    widened = convertTensor(tensor, DType::F32);
    src = &widened;
  }
  std::string header = std::string("{'descr': '") + descrFor(src->type.dtype) +
                       "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < src->type.shape.size(); ++i)
    header += std::to_string(src->type.shape[i]) + ", ";
  if (src->type.shape.size() > 1)
    header.erase(header.size() - 2);
  else if (src->type.shape.size() == 1)
    header.erase(header.size() - 1); // keep "(n,)"
  header += "), }";
  // NumPy pads the header with spaces so the data starts 64-byte aligned;
  // version 2.0 only when the header outgrows 1.0's 16-bit length.
  auto paddedLen = [&](size_t prefix) {
    size_t total = prefix + header.size() + 1;
    return (total + 63) / 64 * 64 - prefix;
  };
  uint8_t major = 1;
  size_t len = paddedLen(10);
  if (len > 65535) {
    major = 2;
    len = paddedLen(12);
  }
  header.append(len - header.size() - 1, ' ');
  header += '\n';

  std::vector<uint8_t> out(kNpyMagic, kNpyMagic + 6);
  out.push_back(major);
  out.push_back(0);
  out.push_back(uint8_t(len));
  out.push_back(uint8_t(len >> 8));
  if (major == 2) {
    out.push_back(uint8_t(len >> 16));
    out.push_back(uint8_t(len >> 24));
  }
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), src->bytes.begin(), src->bytes.end());
  return out;
}

Expected<std::vector<uint8_t>> readFileBytes(const std::string &path,
                                             const std::string &what,
                                             uint64_t maxBytes) {
  return readFileLimited(path, what, maxBytes);
}

Expected<HostTensor> readNpy(const std::string &path) {
  PrefixCheck magic{6, [](const uint8_t *p, size_t n) {
                      if (n < 6 || std::memcmp(p, kNpyMagic, 6) != 0)
                        return Status::error("not a .npy file (bad magic)");
                      return Status::ok();
                    }};
  Expected<std::vector<uint8_t>> bytes =
      readFileLimited(path, ".npy file", kMaxDataFileBytes, magic);
  if (!bytes)
    return bytes.status();
  Expected<HostTensor> t = parseNpy(*bytes);
  if (!t)
    return t.status().withContext(path + ": ");
  return t;
}

Status writeNpy(const std::string &path, const HostTensor &tensor) {
  std::vector<uint8_t> bytes;
  try {
    bytes = encodeNpy(tensor);
  } catch (const std::exception &e) {
    return Status::error(path + ": " + e.what());
  }
  std::FILE *f = std::fopen(path.c_str(), "wb");
  if (!f)
    return Status::error(path + ": " + std::strerror(errno));
  size_t written = std::fwrite(bytes.data(), 1, bytes.size(), f);
  bool closed = std::fclose(f) == 0;
  if (written != bytes.size() || !closed)
    return Status::error(path + ": write failed: " + std::strerror(errno));
  return Status::ok();
}

std::unique_ptr<MappedFile> MappedFile::open(const std::string &path,
                                             uint64_t maxBytes) {
  // A pipe must be opened once, by the whole-file read: stat first.
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
    return nullptr;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return nullptr;
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
      uint64_t(st.st_size) > maxBytes)
    return nullptr;
  void *m = ::mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  if (m == MAP_FAILED)
    return nullptr;
  std::unique_ptr<MappedFile> out(new MappedFile());
  out->data_ = static_cast<const uint8_t *>(m);
  out->size_ = size_t(st.st_size);
  return out;
}

MappedFile::~MappedFile() {
  if (data_)
    ::munmap(const_cast<uint8_t *>(data_), size_);
}

std::unique_ptr<MappedNpy> MappedNpy::tryMap(const std::string &path) {
  std::unique_ptr<MappedFile> file = MappedFile::open(path);
  if (!file || file->size() < 10)
    return nullptr;
  const size_t size = file->size();
  // A .npy header is at most 1 MiB (parseNpyHeader refuses longer ones).
  Expected<NpyHeader> h = parseNpyHeader(file->head((size_t(1) << 20) + 12));
  if (!h)
    return nullptr;
  std::optional<DType> dtype = dtypeFromDescr(h->descr);
  if (!dtype)
    return nullptr;
  int nonUnitDims = 0;
  for (int64_t d : h->shape)
    nonUnitDims += d > 1;
  if (h->fortranOrder && nonUnitDims > 1)
    return nullptr;
  if (h->dataOffset > size ||
      uint64_t(size - h->dataOffset) !=
          uint64_t(h->numElements) * uint64_t(dtypeSize(*dtype)))
    return nullptr;
  std::unique_ptr<MappedNpy> out(new MappedNpy());
  out->data_ = file->data() + h->dataOffset;
  out->type_ = TensorType{*dtype, h->shape};
  out->file_ = std::move(file);
  return out;
}

} // namespace dlopt::rt
