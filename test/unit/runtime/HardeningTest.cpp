// Issue 10's readers in isolation: bounded JSON, bounded file reads, token
// files (overflow, Fortran order), splat constants through the format.
#include "runtime/exec/DataLoader.h"
#include "runtime/exec/Npy.h"
#include "runtime/format/Executable.h"
#include "runtime/support/FileRead.h"
#include "runtime/support/JsonLimits.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

using namespace dlopt::rt;

namespace {

std::string nested(int depth) {
  return std::string(size_t(depth), '[') + std::string(size_t(depth), ']');
}

Expected<nlohmann::ordered_json> parse(const std::string &s) {
  return parseJsonBounded<nlohmann::ordered_json>(s);
}

} // namespace

TEST(JsonLimits, DepthIsBoundedBeforeTheDomIsBuilt) {
  EXPECT_TRUE(parse(nested(kMaxJsonDepth)));
  auto deep = parse(nested(kMaxJsonDepth + 1));
  ASSERT_FALSE(deep);
  EXPECT_EQ(deep.status().message().rfind("nested deeper than 64 levels at /0/",
                                          0),
            0u)
      << deep.status().message();
  // 90,000 levels followed by more keys: the case that overflowed the stack.
  auto huge = parse("{\"a\": " + nested(90000) + ", \"b\": 1}");
  ASSERT_FALSE(huge);
  EXPECT_NE(huge.status().message().find("/a/0/0/0/0/0/.../0/0/0/0/0/0"),
            std::string::npos)
      << huge.status().message();
}

TEST(JsonLimits, DuplicateKeysNameTheirObject) {
  auto top = parse(R"({"a": 1, "a": 2})");
  ASSERT_FALSE(top);
  EXPECT_EQ(top.status().message(),
            "duplicate key \"a\" in the object at the top level (each key "
            "may appear once)");
  auto inner = parse(R"({"x": [1, {"k/~": 1, "k/~": 2}]})");
  ASSERT_FALSE(inner);
  EXPECT_NE(inner.status().message().find("\"k~1~0\" in the object at /x/1"),
            std::string::npos)
      << inner.status().message();
  // The same key in sibling objects is fine.
  EXPECT_TRUE(parse(R"([{"a": 1}, {"a": 2}])"));
}

TEST(JsonLimits, SyntaxErrorsAndComments) {
  auto bad = parse("{\"a\": ");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.status().message().rfind("invalid JSON: ", 0), 0u);
  EXPECT_FALSE(parse(""));
  EXPECT_FALSE(parse("1e999")); // nlohmann refuses overflowing numbers
  EXPECT_FALSE(parse("{\"a\": 1} // c"));
  auto withComment = parseJsonBounded<nlohmann::json>(
      std::string_view("{\"a\": 1} // c"), /*ignoreComments=*/true);
  ASSERT_TRUE(withComment) << withComment.status().message();
  EXPECT_EQ((*withComment)["a"], 1);
}

TEST(FileRead, DirectoriesSizesAndStreams) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / "dlopt_file_read_test";
  fs::create_directories(dir);
  auto d = readFileLimited(dir.string(), "plan file", 1 << 20);
  ASSERT_FALSE(d);
  EXPECT_EQ(d.status().message(),
            dir.string() + ": is a directory, expected a plan file");

  std::string path = (dir / "f.bin").string();
  std::ofstream(path, std::ios::binary) << std::string(100, 'x');
  auto small = readFileLimited(path, "file", 100);
  ASSERT_TRUE(small);
  EXPECT_EQ(small->size(), 100u);
  auto big = readFileLimited(path, "cluster file", 99);
  ASSERT_FALSE(big);
  EXPECT_EQ(big.status().message(),
            path + ": the cluster file is 100 bytes, more than 99 bytes "
                   "allowed");

  // A stream is cut at the limit, and a bad prefix ends the read at once.
  auto zero = readFileLimited("/dev/zero", "token file", 1 << 20);
  ASSERT_FALSE(zero);
  EXPECT_NE(zero.status().message().find("larger than 1 MiB (it is not a "
                                         "regular file"),
            std::string::npos)
      << zero.status().message();
  int calls = 0;
  PrefixCheck magic{4, [&](const uint8_t *p, size_t n) {
                      ++calls;
                      return n >= 4 && p[0] == 'M'
                                 ? Status::ok()
                                 : Status::error("bad magic");
                    }};
  auto prefixed = readFileLimited("/dev/zero", "plan file", kMaxStreamBytes,
                                  magic);
  ASSERT_FALSE(prefixed);
  EXPECT_EQ(prefixed.status().message(), "/dev/zero: bad magic");
  EXPECT_EQ(calls, 1);
  auto missing = readFileLimited((dir / "none").string(), "plan file", 10);
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.status().message().find(
                "none: cannot open plan file: No such file or directory"),
            std::string::npos);
  fs::remove_all(dir);
}

namespace {

std::vector<uint8_t> npyTokens(const std::string &shape, bool fortran,
                               const std::vector<int32_t> &data) {
  std::string hdr = "{'descr': '<i4', 'fortran_order': " +
                    std::string(fortran ? "True" : "False") +
                    ", 'shape': " + shape + ", }";
  while ((10 + hdr.size() + 1) % 64)
    hdr += ' ';
  hdr += '\n';
  std::vector<uint8_t> b = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                            uint8_t(hdr.size()), uint8_t(hdr.size() >> 8)};
  b.insert(b.end(), hdr.begin(), hdr.end());
  for (int32_t v : data)
    for (int k = 0; k < 4; ++k)
      b.push_back(uint8_t(uint32_t(v) >> (8 * k)));
  return b;
}

} // namespace

TEST(TokenFile, FortranOrderIsReadInCOrder) {
  // The 2x3 array [[0, 1, 2], [3, 4, 5]] stored column-major.
  auto t = decodeTokenFile(npyTokens("(2, 3)", true, {0, 3, 1, 4, 2, 5}),
                           TokenDType::U16);
  ASSERT_TRUE(t) << t.status().message();
  EXPECT_EQ(*t, (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  // 2x3x2, element (i, j, k) = 100 i + 10 j + k, stored column-major.
  std::vector<int32_t> f, c;
  for (int k = 0; k < 2; ++k)
    for (int j = 0; j < 3; ++j)
      for (int i = 0; i < 2; ++i)
        f.push_back(100 * i + 10 * j + k);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 2; ++k)
        c.push_back(100 * i + 10 * j + k);
  auto t3 = decodeTokenFile(npyTokens("(2, 3, 2)", true, f), TokenDType::U16);
  ASSERT_TRUE(t3) << t3.status().message();
  EXPECT_EQ(*t3, c);
  auto cOrder = decodeTokenFile(npyTokens("(2, 3, 2)", false, c),
                                TokenDType::U16);
  ASSERT_TRUE(cOrder);
  EXPECT_EQ(*cOrder, c);
}

TEST(TokenFile, ShapeProductsAreChecked) {
  auto t = decodeTokenFile(npyTokens("(4294967296, 4294967296)", false, {1}),
                           TokenDType::U16);
  ASSERT_FALSE(t);
  EXPECT_EQ(t.status().message(), ".npy shape (4294967296, 4294967296) is "
                                  "too large (more than 2^48 elements)");
  auto wrong = decodeTokenFile(npyTokens("(3,)", false, {1, 2}),
                               TokenDType::U16);
  ASSERT_FALSE(wrong);
  EXPECT_EQ(wrong.status().message(),
            "the header's shape holds 3 tokens, the file 2");
}

TEST(ExecutableFormat, SplatConstantsStayOneElement) {
  Executable exe;
  exe.worldSize = 1;
  Value c;
  c.kind = ValueKind::Const;
  c.type = TensorType{DType::F32, {20000, 20000}};
  c.constOffset = 0;
  c.constSplat = true;
  float half = 0.5f;
  exe.constData.resize(4);
  std::memcpy(exe.constData.data(), &half, 4);
  exe.values.push_back(c);
  exe.outputs = {0};
  exe.outputNames = {"y"};
  Program prog;
  prog.memory.offsets = {0};
  prog.memory.persistentBytes = c.type.byteSize();
  exe.programs.push_back(prog);
  auto bytes = serializeExecutable(exe);
  ASSERT_TRUE(bytes) << bytes.status().message();
  EXPECT_LT(bytes->size(), 4096u);
  auto back = deserializeExecutable(*bytes);
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_TRUE(back->values[0].constSplat);
  EXPECT_EQ(back->values[0].constBytes(), 4);

  // Without the flag, one element is not enough data for the type.
  exe.values[0].constSplat = false;
  Status st = exe.validate();
  ASSERT_FALSE(st);
  EXPECT_NE(st.message().find("lies outside the constant data"),
            std::string::npos)
      << st.message();
  // The flag is refused on anything but a constant.
  exe.values[0].constSplat = true;
  exe.values[0].kind = ValueKind::Input;
  exe.values[0].name = "x";
  exe.inputs = {0};
  st = exe.validate();
  ASSERT_FALSE(st);
  EXPECT_NE(st.message().find("is marked const_splat but is not a constant"),
            std::string::npos)
      << st.message();
}
