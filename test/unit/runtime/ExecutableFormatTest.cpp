//===- ExecutableFormatTest.cpp - Plan file encoding and validation -------===//

#include "TestUtil.h"

#include "runtime/format/Executable.h"
#include "runtime/format/MemoryPlanner.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>

using namespace dlopt::rt;
using namespace dlopt::rt::test;

namespace {

/// A random but valid executable: random values of every kind, random
/// instructions with every attribute kind, 1-3 ranks, planned memory.
Executable randomExecutable(std::mt19937_64 &rng) {
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  Executable exe;
  exe.modelName = "model_" + std::to_string(pick(0, 1000));
  exe.source = pick(0, 1) ? "dir/with space/m.mlir" : "";
  exe.worldSize = int32_t(pick(1, 3));
  if (exe.worldSize > 1)
    exe.mesh = Mesh{{"r"}, {exe.worldSize}};
  DType dtypes[] = {DType::F32, DType::F16, DType::BF16,
                    DType::I32, DType::I64, DType::I1};
  auto randomType = [&] {
    TensorType t;
    t.dtype = dtypes[pick(0, 5)];
    int rank = int(pick(0, 3));
    for (int i = 0; i < rank; ++i)
      t.shape.push_back(pick(0, 6));
    return t;
  };
  int numArgs = int(pick(0, 8));
  for (int i = 0; i < numArgs; ++i) {
    Value v;
    v.type = randomType();
    int k = int(pick(0, 3));
    v.kind = k == 0   ? ValueKind::Param
             : k == 1 ? ValueKind::Input
             : k == 2 ? ValueKind::Const
                      : ValueKind::State;
    if (v.kind == ValueKind::State) {
      v.name = "adam.m." + std::to_string(i);
      if (pick(0, 1))
        v.init = Init{"constant", 0, 1, 0, 1, 65536.0};
      exe.states.push_back(int32_t(exe.values.size()));
    } else if (v.kind == ValueKind::Param) {
      v.name = "p\"" + std::to_string(i) + "\\ü";
      const char *dists[] = {"zeros", "ones", "constant", "normal",
                             "truncated_normal", "uniform"};
      v.init.dist = dists[pick(0, 5)];
      v.init.mean = double(pick(-5, 5)) / 3.0;
      v.init.std = double(pick(0, 9)) * 0.01;
      v.init.low = -0.1 * double(pick(0, 9));
      v.init.high = 1e-300 * double(pick(0, 9)) + 1.0;
      v.init.value = 1.0 / 7.0;
      exe.params.push_back(int32_t(exe.values.size()));
    } else if (v.kind == ValueKind::Input) {
      v.name = "in" + std::to_string(i);
      exe.inputs.push_back(int32_t(exe.values.size()));
    } else {
      v.constOffset = int64_t(exe.constData.size());
      for (int64_t b = 0; b < v.type.byteSize(); ++b)
        exe.constData.push_back(uint8_t(pick(0, 255)));
    }
    exe.values.push_back(v);
  }
  int32_t numArgValues = int32_t(exe.values.size());
  for (int32_t r = 0; r < exe.worldSize; ++r) {
    Program p;
    p.ranks = {r};
    std::vector<int32_t> avail;
    for (int32_t v = 0; v < numArgValues; ++v)
      avail.push_back(v);
    int numInstrs = int(pick(0, 12));
    for (int i = 0; i < numInstrs; ++i) {
      // Only verified instructions can be written and read back
      // (runtime/format/OpTable.h): a cast of an available value to a
      // random element type, or an iota when there is none. Extra
      // attributes are kept and ignored.
      Instr in;
      Value v;
      if (avail.empty()) {
        in.op = "iota";
        in.attrs["dim"] = int64_t(0);
        v.type = TensorType{pick(0, 1) ? DType::I32 : DType::F32,
                            {pick(0, 6)}};
      } else {
        in.op = "cast";
        in.operands.push_back(avail[pick(0, avail.size() - 1)]);
        v.type = TensorType{dtypes[pick(0, 5)],
                            exe.values[in.operands[0]].type.shape};
      }
      exe.values.push_back(v);
      in.results.push_back(int32_t(exe.values.size() - 1));
      avail.push_back(in.results.back());
      int numAttrs = int(pick(0, 5));
      for (int a = 0; a < numAttrs; ++a) {
        std::string name = "x" + std::to_string(a);
        switch (pick(0, 4)) {
        case 0: in.attrs[name] = int64_t(pick(INT64_MIN, INT64_MAX)); break;
        case 1: {
          double d = std::ldexp(double(pick(-1000000, 1000000)), int(pick(-60, 60)));
          in.attrs[name] = pick(0, 5) ? d : (pick(0, 1) ? INFINITY : -INFINITY);
          break;
        }
        case 2: in.attrs[name] = std::string(pick(0, 1) ? "tanh" : "q\"u\n\to"); break;
        case 3: {
          std::vector<int64_t> v(size_t(pick(0, 4)));
          for (auto &x : v) x = pick(-9, 9);
          in.attrs[name] = v;
          break;
        }
        case 4: {
          std::vector<double> v(size_t(pick(0, 4)));
          for (auto &x : v) x = double(pick(-99, 99)) / 8.0;
          in.attrs[name] = v;
          break;
        }
        }
      }
      in.layer = int32_t(pick(-1, 3));
      in.loc = pick(0, 1) ? "m.mlir:" + std::to_string(i) + ":5" : "";
      p.instrs.push_back(std::move(in));
    }
    exe.programs.push_back(std::move(p));
  }
  // Outputs: some defined temps and some args, with unique names.
  for (size_t v = 0; v < exe.values.size(); ++v)
    if (pick(0, 3) == 0) {
      bool definedSomewhere = exe.values[v].kind != ValueKind::Temp;
      for (const Program &p : exe.programs)
        for (const Instr &in : p.instrs)
          for (int32_t res : in.results)
            definedSomewhere |= res == int32_t(v);
      if (definedSomewhere) {
        exe.outputs.push_back(int32_t(v));
        exe.outputNames.push_back("out" + std::to_string(v));
      }
    }
  // Some outputs update a param or state of their type (training steps).
  if (pick(0, 1)) {
    exe.outputUpdates.assign(exe.outputs.size(), "");
    std::vector<bool> taken(exe.values.size(), false);
    for (size_t o = 0; o < exe.outputs.size(); ++o)
      for (size_t v = 0; v < size_t(numArgValues); ++v) {
        const Value &a = exe.values[v];
        if ((a.kind == ValueKind::Param || a.kind == ValueKind::State) &&
            !taken[v] && a.type == exe.values[exe.outputs[o]].type &&
            pick(0, 1)) {
          taken[v] = true;
          exe.outputUpdates[o] = a.name;
          break;
        }
      }
  }
  for (Program &p : exe.programs) {
    Expected<MemoryPlan> plan =
        planProgramMemory(exe, p, int64_t(1) << pick(0, 8));
    EXPECT_TRUE(plan.isOk()) << plan.status().message();
    p.memory = *plan;
  }
  return exe;
}

Executable smallExecutable() {
  ExeBuilder b;
  int32_t x = b.input("x", tt({2, 3}));
  int32_t w = b.param("w", tt({3, 4}), Init{"normal", 0.0, 0.02});
  int32_t c = b.constant(tt({4}), {1, 2, 3, 4});
  int32_t y = b.op("matmul", {x, w}, tt({2, 4}), {{"transpose_b", int64_t(0)}});
  int32_t z = b.op("add", {y, c}, tt({2, 4}));
  b.output("z", z);
  return b.build();
}

std::vector<uint8_t> serialize(const Executable &exe) {
  Expected<std::vector<uint8_t>> bytes = serializeExecutable(exe);
  EXPECT_TRUE(bytes.isOk()) << bytes.status().message();
  return bytes ? *bytes : std::vector<uint8_t>{};
}

std::string errorOf(const std::vector<uint8_t> &bytes) {
  Expected<Executable> e = deserializeExecutable(bytes);
  EXPECT_FALSE(e.isOk());
  return e ? std::string("<accepted>") : e.status().message();
}

void putU64(std::vector<uint8_t> &b, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    b[at + i] = uint8_t(v >> (8 * i));
}

/// Rewrites the header so a modified payload passes the checksum, to reach
/// the JSON and validation layers in fuzz tests.
void resealPayload(std::vector<uint8_t> &b) {
  putU64(b, 16, b.size() - kExecutableHeaderSize);
  putU64(b, 24, fnv1a64(b.data() + kExecutableHeaderSize,
                        b.size() - kExecutableHeaderSize));
}

/// Replaces the JSON document of a serialized executable.
std::vector<uint8_t> withJson(const std::vector<uint8_t> &orig,
                              const std::string &json) {
  uint64_t jsonLen = 0;
  for (int i = 0; i < 8; ++i)
    jsonLen |= uint64_t(orig[32 + i]) << (8 * i);
  std::vector<uint8_t> out(orig.begin(), orig.begin() + 40);
  putU64(out, 32, json.size());
  out.insert(out.end(), json.begin(), json.end());
  out.insert(out.end(), orig.begin() + 40 + jsonLen, orig.end());
  resealPayload(out);
  return out;
}

std::string jsonOf(const std::vector<uint8_t> &b) {
  uint64_t jsonLen = 0;
  for (int i = 0; i < 8; ++i)
    jsonLen |= uint64_t(b[32 + i]) << (8 * i);
  return std::string(b.begin() + 40, b.begin() + 40 + jsonLen);
}

} // namespace

TEST(ExecutableFormat, TensorTypeStr) {
  EXPECT_EQ(tt({2, 16, 64}).str(), "2x16x64xf32");
  EXPECT_EQ(tt({}, DType::I32).str(), "i32");
  EXPECT_EQ(tt({0, 4}, DType::BF16).str(), "0x4xbf16");
  Expected<TensorType> t = parseTensorType("2x16xi1");
  ASSERT_TRUE(t.isOk());
  EXPECT_EQ(*t, tt({2, 16}, DType::I1));
  EXPECT_FALSE(parseTensorType("2x-1xf32").isOk());
  EXPECT_FALSE(parseTensorType("2xf31").isOk());
  EXPECT_FALSE(parseTensorType("x2xf32").isOk());
  EXPECT_FALSE(parseTensorType("").isOk());
  EXPECT_FALSE(parseTensorType("99999999999999999999xf32").isOk());
}

TEST(ExecutableFormat, AttributeGetters) {
  Instr in;
  in.op = "sum";
  in.loc = "m.mlir:3:4";
  in.attrs["dims"] = std::vector<int64_t>{0, 1};
  in.attrs["keepdims"] = int64_t(1);
  in.attrs["eps"] = 1e-5;
  in.attrs["mode"] = std::string("tanh");
  EXPECT_EQ(*in.getInts("dims"), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(*in.getInt("keepdims"), 1);
  EXPECT_TRUE(in.getBool("keepdims", false));
  EXPECT_DOUBLE_EQ(*in.getFloat("eps"), 1e-5);
  EXPECT_DOUBLE_EQ(*in.getFloat("keepdims"), 1.0); // ints widen
  EXPECT_EQ(*in.getString("mode"), "tanh");
  EXPECT_EQ(in.getInt("missing", 7), 7);
  EXPECT_DOUBLE_EQ(in.getFloat("missing", 0.5), 0.5);
  EXPECT_FALSE(in.getBool("missing", false));
  Expected<int64_t> bad = in.getInt("eps");
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().message(),
            "instruction 'sum' at m.mlir:3:4: attribute 'eps' expected int, "
            "got float");
  Expected<std::string> missing = in.getString("nope");
  ASSERT_FALSE(missing.isOk());
  EXPECT_EQ(missing.status().message(),
            "instruction 'sum' at m.mlir:3:4: missing attribute 'nope'");
}

TEST(ExecutableFormat, RoundTripSmall) {
  Executable exe = smallExecutable();
  ASSERT_TRUE(exe.validate().isOk()) << exe.validate().message();
  std::vector<uint8_t> bytes = serialize(exe);
  Expected<Executable> back = deserializeExecutable(bytes);
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(*back, exe);
  // Serialization is deterministic.
  EXPECT_EQ(serialize(*back), bytes);
}

TEST(ExecutableFormat, RoundTripRandom) {
  std::mt19937_64 rng(1234);
  for (int iter = 0; iter < 300; ++iter) {
    Executable exe = randomExecutable(rng);
    Status valid = exe.validate();
    ASSERT_TRUE(valid.isOk()) << "iteration " << iter << ": "
                              << valid.message();
    std::vector<uint8_t> bytes = serialize(exe);
    Expected<Executable> back = deserializeExecutable(bytes);
    ASSERT_TRUE(back.isOk()) << "iteration " << iter << ": "
                             << back.status().message();
    ASSERT_EQ(*back, exe) << "iteration " << iter;
    EXPECT_FALSE(dumpExecutable(exe).empty());
  }
}

TEST(ExecutableFormat, PredictionRoundTripsAndIsChecked) {
  Executable exe = smallExecutable();
  exe.prediction = Prediction{"calibrated", 0.25, 3.5e8};
  std::vector<uint8_t> bytes = serialize(exe);
  Expected<Executable> back = deserializeExecutable(bytes);
  ASSERT_TRUE(back.isOk()) << back.status().message();
  ASSERT_TRUE(back->prediction);
  EXPECT_EQ(*back, exe);
  // Optional: a plan without one reads back without one.
  back = deserializeExecutable(serialize(smallExecutable()));
  ASSERT_TRUE(back.isOk());
  EXPECT_FALSE(back->prediction);
  std::string json = jsonOf(bytes);
  auto replaced = [&](const std::string &from, const std::string &to) {
    std::string j = json;
    size_t at = j.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    j.replace(at, from.size(), to);
    return errorOf(withJson(bytes, j));
  };
  EXPECT_EQ(replaced("\"step_time_s\":0.25", "\"step_time_s\":-1.0"),
            "invalid executable: prediction: step_time_s and memory_bytes "
            "must be >= 0");
  EXPECT_NE(replaced("\"cluster\":\"calibrated\"", "\"cluster\":7")
                .find("prediction.cluster"),
            std::string::npos);
}

TEST(ExecutableFormat, NaNAttributeRoundTrips) {
  Executable exe = smallExecutable();
  exe.programs[0].instrs[1].attrs["x"] = std::nan("");
  exe.programs[0].instrs[1].attrs["l"] = std::vector<double>{1.5, NAN, -INFINITY};
  Expected<Executable> back = deserializeExecutable(serialize(exe));
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_TRUE(std::isnan(*back->programs[0].instrs[1].getFloat("x")));
  auto l = std::get<std::vector<double>>(back->programs[0].instrs[1].attrs.at("l"));
  EXPECT_EQ(l[0], 1.5);
  EXPECT_TRUE(std::isnan(l[1]));
  EXPECT_EQ(l[2], -INFINITY);
}

TEST(ExecutableFormat, FileRoundTrip) {
  Executable exe = smallExecutable();
  std::string path =
      (std::filesystem::temp_directory_path() /
       ("dlopt_fmt_test_" + std::to_string(getpid()) + ".plan"))
          .string();
  ASSERT_TRUE(writeExecutable(exe, path).isOk());
  Expected<Executable> back = readExecutable(path);
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(*back, exe);
  std::remove(path.c_str());

  Expected<Executable> missing = readExecutable("/nonexistent/x.plan");
  ASSERT_FALSE(missing.isOk());
  EXPECT_EQ(missing.status().message(),
            "/nonexistent/x.plan: cannot open plan file: No such file or "
            "directory");
  Status badWrite = writeExecutable(exe, "/nonexistent/dir/x.plan");
  EXPECT_FALSE(badWrite.isOk());
}

TEST(ExecutableFormat, RejectsBadMagic) {
  std::vector<uint8_t> bytes = serialize(smallExecutable());
  bytes[0] = 'X';
  EXPECT_EQ(errorOf(bytes), "not a dlopt plan file (bad magic)");
  EXPECT_EQ(errorOf({}), "not a dlopt plan file (bad magic)");
  std::string mlir = "module {\n  func.func @main() { return }\n}\n";
  EXPECT_TRUE(contains(errorOf({mlir.begin(), mlir.end()}),
                       "looks like MLIR text"));
}

TEST(ExecutableFormat, RejectsOtherVersion) {
  std::vector<uint8_t> bytes = serialize(smallExecutable());
  bytes[8] = 7;
  EXPECT_EQ(errorOf(bytes), "plan file format version 7, this dlopt reads "
                            "version 3 (recompile the model with this dlopt)");
  // Plans written before training support (version 1) are rejected too.
  bytes[8] = 1;
  EXPECT_EQ(errorOf(bytes), "plan file format version 1, this dlopt reads "
                            "version 3 (recompile the model with this dlopt)");
}

TEST(ExecutableFormat, RejectsUnknownFlags) {
  std::vector<uint8_t> bytes = serialize(smallExecutable());
  bytes[12] = 1;
  EXPECT_TRUE(contains(errorOf(bytes), "unsupported format flags"));
}

TEST(ExecutableFormat, RejectsTruncation) {
  std::vector<uint8_t> bytes = serialize(smallExecutable());
  size_t payload = bytes.size() - 32;
  std::vector<uint8_t> cut(bytes.begin(), bytes.end() - 10);
  EXPECT_EQ(errorOf(cut), "truncated: header says " + std::to_string(payload) +
                              " bytes of payload, file has " +
                              std::to_string(payload - 10));
  std::vector<uint8_t> headerOnly(bytes.begin(), bytes.begin() + 20);
  EXPECT_EQ(errorOf(headerOnly),
            "truncated: file has 20 bytes, the header alone needs 32");
  // Every prefix is rejected, none crashes.
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + n);
    EXPECT_FALSE(deserializeExecutable(prefix).isOk()) << "length " << n;
  }
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);
  EXPECT_TRUE(contains(errorOf(longer), "trailing data"));
}

TEST(ExecutableFormat, RejectsChecksumMismatch) {
  std::vector<uint8_t> bytes = serialize(smallExecutable());
  bytes[bytes.size() / 2] ^= 0x10;
  EXPECT_TRUE(contains(errorOf(bytes), "checksum mismatch")) << errorOf(bytes);
  EXPECT_TRUE(contains(errorOf(bytes), "the file is corrupt"));
}

TEST(ExecutableFormat, EverySingleBitFlipIsRejected) {
  std::vector<uint8_t> bytes = serialize(smallExecutable());
  for (size_t i = 0; i < bytes.size(); ++i)
    for (int bit = 0; bit < 8; ++bit) {
      std::vector<uint8_t> flipped = bytes;
      flipped[i] ^= uint8_t(1 << bit);
      ASSERT_FALSE(deserializeExecutable(flipped).isOk())
          << "byte " << i << " bit " << bit;
    }
}

TEST(ExecutableFormat, MalformedJson) {
  std::vector<uint8_t> bytes = serialize(smallExecutable());
  std::string err = errorOf(withJson(bytes, "{\"format\": "));
  EXPECT_TRUE(contains(err, "malformed JSON")) << err;
  err = errorOf(withJson(bytes, "[1, 2]"));
  EXPECT_EQ(err, "invalid executable: document: expected an object, got array");
}

TEST(ExecutableFormat, SchemaErrorsNameTheField) {
  std::vector<uint8_t> bytes = serialize(smallExecutable());
  std::string json = jsonOf(bytes);
  auto replaced = [&](const std::string &from, const std::string &to) {
    std::string j = json;
    size_t at = j.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    j.replace(at, from.size(), to);
    return errorOf(withJson(bytes, j));
  };
  EXPECT_EQ(replaced("\"kind\":\"input\"", "\"kind\":\"bogus\""),
            "invalid executable: values[0].kind: expected param, input, "
            "state, const or temp, got 'bogus'");
  EXPECT_EQ(replaced("\"type\":\"2x3xf32\"", "\"type\":\"2x3xf33\""),
            "invalid executable: values[0].type: bad tensor type '2x3xf33': "
            "unknown element type 'f33' (expected f32, f16, bf16, i32, i64 or "
            "i1)");
  EXPECT_EQ(replaced("\"world_size\":1", "\"world_size\":\"one\""),
            "invalid executable: world_size: expected an integer, got string");
  EXPECT_EQ(replaced("\"op\":\"add\"", "\"opx\":\"add\""),
            "invalid executable: programs[0].instrs[1]: missing field 'op'");
  EXPECT_TRUE(contains(replaced("\"operands\":[3,2]", "\"operands\":[3,99]"),
                       "invalid executable: program 0 (ranks 0): instruction 1 "
                       "('add' at test.mlir:2:3): operand id 99 out of range"));
  EXPECT_TRUE(contains(replaced("{\"int\":0}", "{\"int\":0,\"x\":1}"),
                       "programs[0].instrs[0].attrs.transpose_b"));
}

TEST(ExecutableFormat, MutatedPayloadsNeverCrash) {
  std::mt19937_64 rng(99);
  std::vector<uint8_t> bytes = serialize(smallExecutable());
  std::string json = jsonOf(bytes);
  const std::string alphabet = "{}[]\",:0123456789-.eaxfi ";
  int accepted = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string j = json;
    int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      size_t at = rng() % j.size();
      switch (rng() % 3) {
      case 0: j[at] = alphabet[rng() % alphabet.size()]; break;
      case 1: j.erase(at, 1 + rng() % 8); break;
      case 2: j.insert(at, 1, alphabet[rng() % alphabet.size()]); break;
      }
      if (j.empty())
        j = "x";
    }
    Expected<Executable> e = deserializeExecutable(withJson(bytes, j));
    if (e) {
      ++accepted;
      EXPECT_TRUE(e->validate().isOk());
      (void)dumpExecutable(*e);
    }
  }
  // Most mutations break something; the few accepted ones validated above.
  EXPECT_LT(accepted, 1500);
}

//===----------------------------------------------------------------------===//
// validate()
//===----------------------------------------------------------------------===//

TEST(ExecutableValidate, CatchesInconsistencies) {
  auto expectError = [](Executable exe, const std::string &needle) {
    Status st = exe.validate();
    ASSERT_FALSE(st.isOk()) << "expected error containing: " << needle;
    EXPECT_TRUE(contains(st.message(), needle)) << st.message();
  };
  Executable good = smallExecutable();
  ASSERT_TRUE(good.validate().isOk());

  Executable e = good;
  e.worldSize = 2;
  expectError(e, "mesh 1 ranks but world size 2");
  e.mesh = Mesh{{"dp"}, {2}};
  expectError(e, "rank 1 of 2 runs no program");

  e = good;
  std::swap(e.programs[0].instrs[0], e.programs[0].instrs[1]);
  expectError(e, "is used before it is defined");

  e = good;
  e.programs[0].instrs[0].results = {1}; // the param
  expectError(e, "only temporaries can be defined");

  e = good;
  e.programs[0].instrs[1].results = {3}; // redefines %3
  expectError(e, "is already defined by instruction 0");

  e = good;
  e.values[1].name = "x";
  expectError(e, "two params/inputs/states are named 'x'");

  e = good;
  e.values[2].constOffset = 1000;
  expectError(e, "lies outside the constant data");

  e = good;
  e.programs[0].memory.alignment = 48;
  expectError(e, "must be a power of two");

  e = good;
  e.programs[0].memory.offsets.pop_back();
  expectError(e, "offsets, expected one per value");

  e = good;
  e.programs[0].memory.offsets[1] = e.programs[0].memory.offsets[0];
  expectError(e, "memory plan overlaps live values");

  e = good;
  e.programs[0].memory.offsets[0] = 3;
  expectError(e, "is not aligned to 64");

  e = good;
  e.programs[0].memory.scratchBytes = 0;
  expectError(e, "ends past the arena");

  e = good;
  e.values[1].init.dist = "gaussian";
  expectError(e, "unknown init distribution 'gaussian'");

  e = good;
  e.params.clear();
  expectError(e, "is missing from the param list");

  e = good;
  e.outputNames.push_back("extra");
  expectError(e, "1 outputs but 2 output names");

  e = good;
  e.values.push_back(Value{"", tt({1 << 30, 1 << 30}), ValueKind::Temp, {}, -1});
  for (Program &p : e.programs)
    p.memory.offsets.push_back(-1);
  expectError(e, "has an invalid or too large type");

  e = good;
  e.programs[0].instrs[1].operands = {4, 2}; // reads its own result
  e.programs[0].instrs[1].results = {4};
  expectError(e, "is used before it is defined");

  e = good;
  e.outputs = {4};
  e.programs[0].instrs.pop_back();
  expectError(e, "is not defined by any instruction");
}

/// A training step: one param, one state, their updates and a loss.
Executable trainingExecutable() {
  ExeBuilder b;
  int32_t x = b.input("x", tt({2, 3}));
  int32_t w = b.param("w", tt({3, 4}), Init{"normal", 0.0, 0.02});
  int32_t m = b.state("adam.m.w", tt({3, 4}));
  int32_t sc = b.state("loss_scale", tt({}), Init{"constant", 0, 1, 0, 1, 1024});
  int32_t y = b.op("matmul", {x, w}, tt({2, 4}));
  int32_t loss = b.op("mean", {y}, tt({}),
                      {{"dims", std::vector<int64_t>{0, 1}},
                       {"keepdims", int64_t(0)}});
  int32_t m2 = b.op("add", {m, w}, tt({3, 4}));
  int32_t w2 = b.op("sub", {w, m2}, tt({3, 4}));
  b.output("loss", loss);
  b.output("w.next", w2, "w");
  b.output("m.next", m2, "adam.m.w");
  b.output("scale", sc);
  return b.build();
}

TEST(ExecutableFormat, TrainingFieldsRoundTrip) {
  Executable exe = trainingExecutable();
  ASSERT_TRUE(exe.validate().isOk()) << exe.validate().message();
  std::vector<uint8_t> bytes = serialize(exe);
  std::string json = jsonOf(bytes);
  EXPECT_TRUE(contains(json, "\"kind\":\"state\"")) << json;
  EXPECT_TRUE(contains(json, "\"states\":[2,3]")) << json;
  EXPECT_TRUE(contains(json, "\"output_updates\":[\"\",\"w\",\"adam.m.w\",\"\"]"))
      << json;
  Expected<Executable> back = deserializeExecutable(bytes);
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(*back, exe);
  EXPECT_EQ(back->values[3].init.value, 1024);

  // An inference plan keeps output_updates empty, and it round-trips so.
  Executable inf = smallExecutable();
  EXPECT_TRUE(inf.outputUpdates.empty());
  Expected<Executable> infBack = deserializeExecutable(serialize(inf));
  ASSERT_TRUE(infBack.isOk());
  EXPECT_EQ(*infBack, inf);

  // Both new fields are required in version 2.
  auto without = [&](const std::string &field, const std::string &value) {
    std::string j = json;
    std::string from = ",\"" + field + "\":" + value;
    size_t at = j.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    j.erase(at, from.size());
    return errorOf(withJson(bytes, j));
  };
  EXPECT_EQ(without("states", "[2,3]"),
            "invalid executable: document: missing field 'states'");
  EXPECT_EQ(without("output_updates", "[\"\",\"w\",\"adam.m.w\",\"\"]"),
            "invalid executable: document: missing field 'output_updates'");
}

TEST(ExecutableValidate, Updates) {
  auto expectError = [](Executable exe, const std::string &needle) {
    Status st = exe.validate();
    ASSERT_FALSE(st.isOk()) << "expected error containing: " << needle;
    EXPECT_EQ(st.message(), needle);
  };
  Executable good = trainingExecutable();
  ASSERT_TRUE(good.validate().isOk());
  Executable e = good;
  e.outputUpdates[1] = "nope";
  expectError(e, "output 'w.next' updates 'nope', which is not a param or "
                 "state");
  e = good;
  e.outputUpdates[1] = "x";
  expectError(e, "output 'w.next' updates 'x', which is not a param or state");
  e = good;
  e.outputUpdates[0] = "loss_scale"; // f32 scalar: same type, allowed
  EXPECT_TRUE(e.validate().isOk()) << e.validate().message();
  e.outputUpdates[0] = "w";
  expectError(e, "output 'loss' updates 'w': the param is 3x4xf32, the "
                 "output is f32");
  e = good;
  e.outputUpdates[2] = "w";
  expectError(e, "output 'm.next' updates 'w', which output 'w.next' "
                 "already updates");
  e = good;
  e.outputUpdates.pop_back();
  expectError(e, "there are 4 outputs but 3 output updates (expected one per "
                 "output, or none)");
  e = good;
  e.states = {2};
  expectError(e, "state %3 ('loss_scale') is missing from the state list");
  e = good;
  e.states = {2, 1};
  expectError(e, "state list names %1 ('w') which is a param");
  e = good;
  e.values[3].init.dist = "bogus";
  expectError(e, "state %3 ('loss_scale') has unknown init distribution "
                 "'bogus' (expected zeros, ones, constant, normal, "
                 "truncated_normal or uniform)");
}

TEST(ExecutableDump, ShowsStatesAndUpdates) {
  std::string d = dumpExecutable(trainingExecutable());
  EXPECT_TRUE(contains(d, "(1 params, 1 inputs, 2 states, 0 consts, 4 temps)"))
      << d;
  EXPECT_TRUE(contains(d, "state  adam.m.w")) << d;
  EXPECT_TRUE(contains(d, "init constant(1024.0)")) << d;
  EXPECT_TRUE(contains(d, "w.next = %7 : 3x4xf32  -> updates w")) << d;
}

TEST(ExecutableValidate, ScratchReuseIsAllowedWhenLifetimesDisjoint) {
  ExeBuilder b;
  int32_t x = b.input("x", tt({16}));
  int32_t t1 = b.op("neg", {x}, tt({16}));
  int32_t t2 = b.op("neg", {t1}, tt({16}));
  int32_t t3 = b.op("neg", {t2}, tt({16}));
  b.output("y", t3);
  Executable exe = b.build();
  ASSERT_TRUE(exe.validate().isOk()) << exe.validate().message();
  // t1 and t3 never live together, so the planner may share their bytes.
  const auto &off = exe.programs[0].memory.offsets;
  EXPECT_EQ(off[t1], off[t3]);
  EXPECT_NE(off[t1], off[t2]);
  EXPECT_EQ(exe.programs[0].memory.scratchBytes, 128);
}

// A reshape of a temporary is a view: the planner gives the result its
// operand's offset (chains too), keeps the shared bytes live until the last
// use of any name, and the validator accepts exactly that.
TEST(ExecutableValidate, ReshapeResultsAreViews) {
  ExeBuilder b;
  int32_t x = b.input("x", tt({4, 8}));
  int32_t t1 = b.op("neg", {x}, tt({4, 8}));
  int32_t t2 = b.op("reshape", {t1}, tt({32}));
  int32_t t3 = b.op("reshape", {t2}, tt({8, 4}));
  int32_t t4 = b.op("neg", {t3}, tt({8, 4}));
  int32_t t5 = b.op("neg", {t4}, tt({8, 4}));
  int32_t t6 = b.op("add", {t5, t3}, tt({8, 4})); // t3 read late
  int32_t t7 = b.op("reshape", {t6}, tt({32}));   // an output: own bytes
  int32_t t8 = b.op("reshape", {x}, tt({32}));    // of an input: a copy
  b.output("y", t7);
  b.output("z", t8);
  Executable exe = b.build();
  ASSERT_TRUE(exe.validate().isOk()) << exe.validate().message();
  const auto &off = exe.programs[0].memory.offsets;
  EXPECT_EQ(off[t2], off[t1]);
  EXPECT_EQ(off[t3], off[t1]);
  EXPECT_NE(off[t7], off[t6]);
  EXPECT_NE(off[t8], off[x]);
  // The shared buffer lives until t6 reads t3, so t4 and t5 (defined
  // while it is live) never take its bytes.
  EXPECT_NE(off[t4], off[t1]);
  EXPECT_NE(off[t5], off[t1]);
  // Without views every reshape has bytes of its own.
  Expected<MemoryPlan> copies =
      planProgramMemory(exe, exe.programs[0], 64, /*viewReshapes=*/false);
  ASSERT_TRUE(copies);
  EXPECT_NE(copies->offsets[t2], copies->offsets[t1]);
  EXPECT_NE(copies->offsets[t3], copies->offsets[t2]);
  // A value live beside the view may not share its bytes.
  Executable bad = exe;
  bad.programs[0].memory.offsets[t5] = off[t1];
  Status st = bad.validate();
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("memory plan overlaps live values"),
            std::string::npos)
      << st.message();
  // A reshape at its operand's offset with a different byte size is no
  // view: the validator sees two overlapping values.
  ExeBuilder c;
  int32_t u = c.input("u", tt({4, 8}));
  int32_t v1 = c.op("neg", {u}, tt({4, 8}));
  int32_t v2 = c.op("reshape", {v1}, tt({32}));
  int32_t v3 = c.op("neg", {v2}, tt({32}));
  int32_t v4 = c.op("add", {v3, v2}, tt({32}));
  c.output("w", v4);
  Executable ok = c.build();
  ASSERT_TRUE(ok.validate().isOk()) << ok.validate().message();
  Executable clash = ok;
  clash.programs[0].memory.offsets[v3] =
      clash.programs[0].memory.offsets[v1];
  EXPECT_FALSE(clash.validate().isOk());
}

TEST(ExecutableDump, ReadableListing) {
  Executable exe = smallExecutable();
  exe.programs[0].instrs[0].layer = 0;
  std::string d = dumpExecutable(exe);
  EXPECT_TRUE(contains(d, "dlopt executable (format version 3)")) << d;
  EXPECT_TRUE(contains(d, "%3 = matmul(%0, %1) {transpose_b=0} : 2x4xf32  "
                          "@layer 0  test.mlir:1:3"))
      << d;
  EXPECT_TRUE(contains(d, "%4 = add(%3, %2) : 2x4xf32  test.mlir:2:3")) << d;
  EXPECT_TRUE(contains(d, "init normal(mean=0.0, std=0.02)")) << d;
  EXPECT_TRUE(contains(d, "z = %4 : 2x4xf32")) << d;
  EXPECT_TRUE(contains(d, "memory of program 0: persistent")) << d;
  // Dumping an invalid executable must not crash either.
  exe.programs[0].instrs[0].results = {12345};
  exe.outputs = {-3};
  EXPECT_TRUE(contains(dumpExecutable(exe), "<bad id>"));
}

// Every instruction passes the op table's verifier (runtime/format/OpTable.h)
// before an executable is written or after it is read: an unknown op or a
// badly typed one is refused with the instruction, the op, its location and
// what was expected versus what it got.
TEST(ExecutableFormat, RefusesUnverifiedInstructions) {
  Executable exe = smallExecutable();
  ASSERT_FALSE(exe.programs[0].instrs.empty());
  Instr &first = exe.programs[0].instrs[0];
  std::string op = first.op;
  first.op = "weird.op_name";
  Expected<std::vector<uint8_t>> bytes = serializeExecutable(exe);
  ASSERT_FALSE(bytes.isOk());
  EXPECT_NE(bytes.status().message().find(
                "instruction 0 ('weird.op_name'"),
            std::string::npos)
      << bytes.status().message();
  EXPECT_NE(bytes.status().message().find("unknown op"), std::string::npos)
      << bytes.status().message();
  // A known op whose attributes do not fit its operands: x [2, 3] times
  // w [3, 4] transposed.
  first.op = op;
  ASSERT_EQ(op, "matmul");
  first.attrs["transpose_b"] = int64_t(1);
  Status st = exe.validate();
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("instruction 0 ('matmul'"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("contraction dims differ: 2x3xf32 vs 3x4xf32 "
                              "(transposed)"),
            std::string::npos)
      << st.message();
}
