//===- NpyTest.cpp - NumPy .npy reading and writing -----------------------===//

#include "TestUtil.h"

#include "runtime/exec/Npy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

using namespace dlopt::rt;
using namespace dlopt::rt::test;

namespace {

std::vector<uint8_t> npyBytes(const std::string &header,
                              const std::vector<uint8_t> &data,
                              uint8_t major = 1) {
  std::vector<uint8_t> b = {0x93, 'N', 'U', 'M', 'P', 'Y', major, 0};
  size_t len = header.size();
  b.push_back(uint8_t(len));
  b.push_back(uint8_t(len >> 8));
  if (major >= 2) {
    b.push_back(uint8_t(len >> 16));
    b.push_back(uint8_t(len >> 24));
  }
  b.insert(b.end(), header.begin(), header.end());
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

std::string parseError(const std::vector<uint8_t> &bytes) {
  Expected<HostTensor> t = parseNpy(bytes);
  EXPECT_FALSE(t.isOk());
  return t ? "<accepted>" : t.status().message();
}

std::string tempPath(const std::string &name) {
  return (std::filesystem::temp_directory_path() /
          (std::to_string(getpid()) + "_" + name))
      .string();
}

} // namespace

TEST(Npy, RoundTripEveryDType) {
  std::mt19937_64 rng(5);
  for (DType d : {DType::F32, DType::F16, DType::I32, DType::I64, DType::I1}) {
    for (auto shape : std::vector<std::vector<int64_t>>{{}, {5}, {2, 3}, {0, 4}, {2, 1, 3}}) {
      HostTensor t(tt(shape, d));
      for (int64_t i = 0; i < t.numElements(); ++i)
        t.setElementFromDouble(i, double(int64_t(rng() % 200) - 100) / 4.0);
      Expected<HostTensor> back = parseNpy(encodeNpy(t));
      ASSERT_TRUE(back.isOk()) << back.status().message();
      EXPECT_EQ(back->type, t.type);
      EXPECT_EQ(back->bytes, t.bytes);
    }
  }
}

TEST(Npy, HeaderIsAlignedAndNumpyStyle) {
  HostTensor t(tt({2, 3}));
  std::vector<uint8_t> b = encodeNpy(t);
  size_t len = size_t(b[8]) | size_t(b[9]) << 8;
  EXPECT_EQ((10 + len) % 64, 0u);
  std::string header(b.begin() + 10, b.begin() + 10 + len);
  EXPECT_EQ(header.rfind("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 0), 0u);
  EXPECT_EQ(header.back(), '\n');
  HostTensor v(tt({7}, DType::I64));
  std::vector<uint8_t> b1 = encodeNpy(v);
  std::string h1(b1.begin() + 10, b1.begin() + 10 + (size_t(b1[8]) | size_t(b1[9]) << 8));
  EXPECT_TRUE(contains(h1, "'shape': (7,)")) << h1;
  HostTensor s(tt({}, DType::I1));
  std::vector<uint8_t> b0 = encodeNpy(s);
  std::string h0(b0.begin() + 10, b0.begin() + 10 + (size_t(b0[8]) | size_t(b0[9]) << 8));
  EXPECT_TRUE(contains(h0, "'descr': '|b1'")) << h0;
  EXPECT_TRUE(contains(h0, "'shape': ()")) << h0;
}

TEST(Npy, Bf16IsWrittenAsFloat32) {
  HostTensor t(tt({3}, DType::BF16));
  t.setElementFromDouble(0, 1.5);
  t.setElementFromDouble(1, -0.1);
  t.setElementFromDouble(2, 3e38);
  Expected<HostTensor> back = parseNpy(encodeNpy(t));
  ASSERT_TRUE(back.isOk());
  EXPECT_EQ(back->type, tt({3}, DType::F32));
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(back->elementAsDouble(i), t.elementAsDouble(i));
}

TEST(Npy, AcceptsNumpyVariants) {
  std::vector<uint8_t> data(8, 0);
  data[0] = 1;
  // Version 2.0, double quotes, no trailing comma, '=' byte order, spaces.
  Expected<HostTensor> t = parseNpy(npyBytes(
      "{\"descr\": \"=i4\", \"shape\": (2,), \"fortran_order\": False}   \n",
      data, 2));
  ASSERT_TRUE(t.isOk()) << t.status().message();
  EXPECT_EQ(t->type, tt({2}, DType::I32));
  EXPECT_EQ(t->elementAsDouble(0), 1.0);
  // Fortran order is harmless when at most one dim exceeds 1.
  EXPECT_TRUE(parseNpy(npyBytes("{'descr': '<i4', 'fortran_order': True, "
                                "'shape': (1, 2), }\n",
                                data))
                  .isOk());
  // uint8 0/1 reads as i1.
  Expected<HostTensor> u = parseNpy(npyBytes(
      "{'descr': '|u1', 'fortran_order': False, 'shape': (2,), }\n", {0, 1}));
  ASSERT_TRUE(u.isOk());
  EXPECT_EQ(u->type, tt({2}, DType::I1));
}

TEST(Npy, RejectsBadFiles) {
  std::vector<uint8_t> f4(24, 0);
  auto hdr = [](const std::string &descr, const std::string &fortran,
                const std::string &shape) {
    return "{'descr': '" + descr + "', 'fortran_order': " + fortran +
           ", 'shape': " + shape + ", }\n";
  };
  EXPECT_EQ(parseError({1, 2, 3}), "not a .npy file (bad magic)");
  EXPECT_EQ(parseError(npyBytes(hdr("<f4", "True", "(2, 3)"), f4)),
            "Fortran-order .npy arrays are not supported; save with "
            "numpy.ascontiguousarray(array)");
  EXPECT_TRUE(contains(parseError(npyBytes(hdr(">f4", "False", "(2, 3)"), f4)),
                       "big-endian"));
  EXPECT_TRUE(contains(parseError(npyBytes(hdr("<f8", "False", "(3,)"), f4)),
                       "unsupported .npy dtype '<f8' (float64: save with "
                       "array.astype(numpy.float32))"));
  EXPECT_EQ(parseError(npyBytes(hdr("<f4", "False", "(2, 4)"), f4)),
            "truncated .npy data: shape 2x4xf32 needs 32 bytes, file has 24");
  EXPECT_TRUE(contains(parseError(npyBytes(hdr("<f4", "False", "(2, 2)"), f4)),
                       "corrupt .npy data"));
  EXPECT_TRUE(contains(parseError(npyBytes("{'descr': '<f4', 'shape': (6,), }\n", f4)),
                       "missing key 'fortran_order'"));
  EXPECT_TRUE(contains(parseError(npyBytes(hdr("<f4", "Maybe", "(6,)"), f4)),
                       "'fortran_order' must be True or False"));
  EXPECT_TRUE(contains(parseError(npyBytes(hdr("<f4", "False", "(-6,)"), f4)),
                       "malformed .npy header"));
  EXPECT_TRUE(contains(parseError(npyBytes(hdr("<f4", "False", "[6]"), f4)),
                       "'shape' must be a tuple"));
  EXPECT_TRUE(contains(parseError(npyBytes("{'descr': '<f4', 'extra': 1}", f4)),
                       "unexpected key 'extra'"));
  EXPECT_TRUE(contains(parseError(npyBytes(hdr("|u1", "False", "(2,)"), {0, 7})),
                       "every element is 0 or 1"));
  EXPECT_TRUE(contains(parseError(npyBytes(hdr("<f4", "False", "(6,)"), f4, 9)),
                       "unsupported .npy format version 9.0"));
  std::vector<uint8_t> cut = npyBytes(hdr("<f4", "False", "(6,)"), f4);
  cut.resize(20);
  EXPECT_TRUE(contains(parseError(cut), "truncated .npy header"));
  EXPECT_TRUE(contains(
      parseError(npyBytes(hdr("<f4", "False", "(99999999999, 99999999999)"), f4)),
      "too large"));
}

TEST(Npy, TruncatedAndFlippedFilesNeverCrash) {
  HostTensor t(tt({3, 5}, DType::I64));
  std::vector<uint8_t> bytes = encodeNpy(t);
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_FALSE(parseNpy({bytes.begin(), bytes.begin() + n}).isOk());
  std::mt19937_64 rng(1);
  for (int i = 0; i < 2000; ++i) {
    std::vector<uint8_t> b = bytes;
    b[rng() % 128] ^= uint8_t(1u << (rng() % 8));
    (void)parseNpy(b); // may be accepted (e.g. a flipped pad byte), never crash
  }
}

TEST(Npy, FileIO) {
  std::string path = tempPath("dlopt_npy_test.npy");
  HostTensor t(tt({4}, DType::F16));
  t.setElementFromDouble(2, 0.5);
  ASSERT_TRUE(writeNpy(path, t).isOk());
  Expected<HostTensor> back = readNpy(path);
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(back->bytes, t.bytes);
  std::remove(path.c_str());
  Expected<HostTensor> missing = readNpy("/nonexistent.npy");
  ASSERT_FALSE(missing.isOk());
  EXPECT_EQ(missing.status().message(),
            "/nonexistent.npy: cannot open .npy file: No such file or directory");
}

// Cross-check with NumPy itself when it is installed.
TEST(Npy, InteropWithNumpy) {
  // A pyenv or venv python3 may lack numpy while the system one has it.
  std::string python;
  for (const char *candidate : {"python3", "/usr/bin/python3"}) {
    std::string probe =
        std::string(candidate) + " -c 'import numpy' >/dev/null 2>&1";
    if (std::system(probe.c_str()) == 0) {
      python = candidate;
      break;
    }
  }
  if (python.empty())
    GTEST_SKIP() << "python3 with numpy not available";
  std::string ours = tempPath("dlopt_npy_ours.npy");
  std::string theirs = tempPath("dlopt_npy_theirs.npy");
  HostTensor t(tt({2, 3}, DType::I32));
  for (int i = 0; i < 6; ++i)
    t.setElementFromDouble(i, i * 10 - 7);
  ASSERT_TRUE(writeNpy(ours, t).isOk());
  std::string cmd =
      python + " -c \"import numpy as np; a = np.load('" + ours +
      "'); assert a.dtype == np.int32 and a.shape == (2, 3), a; "
      "assert a.ravel().tolist() == [-7, 3, 13, 23, 33, 43], a; "
      "np.save('" + theirs + "', np.arange(12, dtype=np.float16).reshape(3, 4) / 3)\"";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  Expected<HostTensor> back = readNpy(theirs);
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(back->type, tt({3, 4}, DType::F16));
  EXPECT_NEAR(back->elementAsDouble(5), 5.0 / 3.0, 1e-3);
  std::remove(ours.c_str());
  std::remove(theirs.c_str());
}
