//===- TrainingTest.cpp - Updates, data loaders, checkpoints, the loop ----===//

#include "TrainingModels.h"

#include "runtime/exec/Checkpoint.h"
#include "runtime/exec/CpuBackend.h"
#include "runtime/exec/DataLoader.h"
#include "runtime/exec/Npy.h"
#include "runtime/exec/ParamInit.h"
#include "runtime/exec/SafeTensors.h"
#include "runtime/exec/Session.h"
#include "runtime/exec/Trainer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sys/stat.h>
#include <thread>

using namespace dlopt::rt;
using namespace dlopt::rt::test;
namespace fs = std::filesystem;

namespace {

std::unique_ptr<Session> makeSession(Executable exe, uint64_t seed = 0) {
  Expected<std::unique_ptr<Session>> s = Session::create(
      std::move(exe), std::make_unique<CpuBackend>(), SessionOptions{0, seed});
  EXPECT_TRUE(s.isOk()) << s.status().message();
  return s ? s.take() : nullptr;
}

class TempDir {
public:
  TempDir() {
    path = fs::temp_directory_path() /
           ("dlopt_train_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string &name) const {
    return (path / name).string();
  }
  fs::path path;
};

void writeBytes(const std::string &path, const std::vector<uint8_t> &b) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char *>(b.data()), std::streamsize(b.size()));
}

/// A raw uint16 token file: a noisy repeating pattern over `vocab` ids.
std::string writeTokens(const TempDir &dir, int64_t count, int64_t vocab) {
  std::vector<uint8_t> b;
  for (int64_t i = 0; i < count; ++i) {
    uint16_t t = uint16_t((i * 3 + (i / 7) % 2) % vocab);
    b.push_back(uint8_t(t));
    b.push_back(uint8_t(t >> 8));
  }
  std::string path = dir.file("tokens.bin");
  writeBytes(path, b);
  return path;
}

/// Linearly separable-ish samples: class c has its mean at feature c.
void writeClassifierData(const TempDir &dir, int64_t n, int64_t dim,
                         int64_t classes, const std::string &prefix) {
  HostTensor x(tt({n, dim})), y(tt({n}, DType::I64));
  for (int64_t i = 0; i < n; ++i) {
    int64_t c = (i * 7 + 3) % classes;
    y.setElementFromDouble(i, double(c));
    for (int64_t d = 0; d < dim; ++d)
      x.setElementFromDouble(i * dim + d,
                             (d == c ? 2.0 : 0.0) +
                                 0.3 * std::sin(double(i * dim + d)));
  }
  ASSERT_TRUE(writeNpy(dir.file(prefix + "images.npy"), x).isOk());
  ASSERT_TRUE(writeNpy(dir.file(prefix + "labels.npy"), y).isOk());
}

std::vector<uint32_t> lossBits(const std::vector<StepResult> &h) {
  std::vector<uint32_t> bits;
  for (const StepResult &r : h)
    bits.push_back(std::bit_cast<uint32_t>(float(r.loss)));
  return bits;
}

TrainerOptions quietOptions(int64_t steps) {
  TrainerOptions o;
  o.steps = steps;
  o.progress = TrainerOptions::Progress::None;
  return o;
}

} // namespace

//===----------------------------------------------------------------------===//
// Session: states and updates
//===----------------------------------------------------------------------===//

TEST(TrainingSession, StepAppliesUpdates) {
  auto s = makeSession(bigramModel(5, 2, 3), 3);
  ASSERT_TRUE(s);
  EXPECT_TRUE(s->hasUpdates());
  ASSERT_TRUE(s->initializeParams().isOk());
  Expected<HostTensor> step0 = s->readArgument("step");
  ASSERT_TRUE(step0.isOk()) << step0.status().message();
  EXPECT_EQ(step0->type, tt({}, DType::I64));
  EXPECT_EQ(step0->elementAsDouble(0), 0);
  HostTensor table0 = *s->readArgument("table");

  HostTensor tokens(tt({2, 3}, DType::I32)), labels(tt({2, 3}, DType::I32));
  for (int i = 0; i < 6; ++i) {
    tokens.setElementFromDouble(i, i % 5);
    labels.setElementFromDouble(i, (i + 1) % 5);
  }
  ASSERT_TRUE(s->bind("tokens", tokens).isOk());
  ASSERT_TRUE(s->bind("labels", labels).isOk());

  // Look before applying: nothing changed yet.
  Expected<std::vector<NamedTensor>> out = s->step(/*apply=*/false);
  ASSERT_TRUE(out.isOk()) << out.status().message();
  std::vector<std::string> names;
  for (const NamedTensor &t : *out)
    names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"loss", "lr", "grad_norm"}));
  EXPECT_EQ(s->readArgument("table")->bytes, table0.bytes);
  HostTensor m1 = *s->readOutput("m.next");
  ASSERT_TRUE(s->applyUpdates().isOk());
  Status again = s->applyUpdates();
  EXPECT_EQ(again.message(),
            "no run to apply updates from (updates are applied once per run)");

  // table' = table - 0.5 m', m' = dtable; step' = 1.
  HostTensor table1 = *s->readArgument("table");
  EXPECT_EQ(s->readArgument("sgd.m.table")->bytes, m1.bytes);
  for (int64_t i = 0; i < 25; ++i)
    EXPECT_FLOAT_EQ(float(table1.elementAsDouble(i)),
                    float(table0.elementAsDouble(i)) -
                        0.5f * float(m1.elementAsDouble(i)));
  EXPECT_EQ(s->readArgument("step")->elementAsDouble(0), 1);

  // Training lowers the loss on a fixed batch.
  double first = (*out)[0].tensor.elementAsDouble(0), last = first;
  for (int i = 0; i < 20; ++i)
    last = s->step()->at(0).tensor.elementAsDouble(0);
  EXPECT_LT(last, first * 0.5);
  EXPECT_EQ(s->readArgument("step")->elementAsDouble(0), 21);
  // run() still returns every output, updates included.
  EXPECT_EQ(s->run()->size(), 6u);
}

TEST(TrainingSession, StatesBindAndInitialize) {
  auto s = makeSession(divergingModel(/*lossScale=*/true));
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->initializeParams().isOk());
  EXPECT_EQ(s->readArgument("loss_scale")->elementAsDouble(0), 1024);
  HostTensor v(tt({}));
  v.setElementFromDouble(0, 8);
  ASSERT_TRUE(s->bind("loss_scale", v).isOk());
  EXPECT_EQ(s->readArgument("loss_scale")->elementAsDouble(0), 8);
  Status st = s->bind("loss_scale", HostTensor(tt({2})));
  EXPECT_EQ(st.message(), "state 'loss_scale': expected f32, got 2xf32");
  st = s->bind("nope", v);
  EXPECT_EQ(st.message(),
            "no input, param or state named 'nope' (known: p, loss_scale)");
}

//===----------------------------------------------------------------------===//
// safetensors
//===----------------------------------------------------------------------===//

TEST(SafeTensors, RoundTripEveryDType) {
  std::vector<NamedTensor> tensors;
  DType all[] = {DType::F32, DType::F16, DType::BF16,
                 DType::I32, DType::I64, DType::I1};
  for (DType d : all) {
    HostTensor t(tt({2, 3}, d));
    for (int i = 0; i < 6; ++i)
      t.setElementFromDouble(i, d == DType::I1 ? i % 2 : i - 2.5);
    tensors.push_back({std::string("t_") + dtypeName(d), t});
  }
  tensors.push_back({"scalar", HostTensor(tt({}, DType::I64))});
  tensors.push_back({"empty", HostTensor(tt({0, 4}))});
  std::map<std::string, std::string> meta = {{"format", "x"}, {"k", "v \"q\""}};
  Expected<std::vector<uint8_t>> bytes = encodeSafeTensors(tensors, meta);
  ASSERT_TRUE(bytes.isOk()) << bytes.status().message();
  uint64_t n = 0;
  std::memcpy(&n, bytes->data(), 8);
  EXPECT_EQ(n % 8, 0u); // data starts aligned
  std::string header(bytes->begin() + 8, bytes->begin() + 8 + long(n));
  EXPECT_TRUE(contains(header, "\"t_bf16\":{\"dtype\":\"BF16\",\"shape\":[2,3],"
                               "\"data_offsets\":[36,48]}"))
      << header;
  EXPECT_TRUE(contains(header, "\"dtype\":\"BOOL\"")) << header;
  Expected<SafeTensorsFile> back = parseSafeTensors(*bytes);
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(back->metadata, meta);
  ASSERT_EQ(back->tensors.size(), tensors.size());
  for (const NamedTensor &t : tensors) {
    const HostTensor *got = back->find(t.name);
    ASSERT_TRUE(got) << t.name;
    EXPECT_EQ(got->type, t.tensor.type) << t.name;
    EXPECT_EQ(got->bytes, t.tensor.bytes) << t.name;
  }
  EXPECT_FALSE(encodeSafeTensors({tensors[0], tensors[0]}, {}).isOk());
}

TEST(SafeTensors, ReadsHandWrittenFile) {
  // As the reference Python writer lays it out: header, then data.
  std::string header = "{\"__metadata__\":{\"format\":\"pt\"},"
                       "\"b\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[8,12]},"
                       "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  std::vector<uint8_t> bytes(8);
  uint64_t n = header.size();
  std::memcpy(bytes.data(), &n, 8);
  bytes.insert(bytes.end(), header.begin(), header.end());
  float a[2] = {1.5f, -2.0f};
  int32_t b = 7;
  bytes.insert(bytes.end(), reinterpret_cast<uint8_t *>(a),
               reinterpret_cast<uint8_t *>(a) + 8);
  bytes.insert(bytes.end(), reinterpret_cast<uint8_t *>(&b),
               reinterpret_cast<uint8_t *>(&b) + 4);
  Expected<SafeTensorsFile> f = parseSafeTensors(bytes);
  ASSERT_TRUE(f.isOk()) << f.status().message();
  EXPECT_EQ(f->tensors[0].name, "a"); // data order
  EXPECT_EQ(f->find("a")->elementAsDouble(1), -2.0);
  EXPECT_EQ(f->find("b")->elementAsDouble(0), 7);
  EXPECT_EQ(f->metadata.at("format"), "pt");
}

TEST(SafeTensors, RejectsCorruptFiles) {
  HostTensor t(tt({4}));
  Expected<std::vector<uint8_t>> good =
      encodeSafeTensors({{"w", t}, {"v", HostTensor(tt({2}, DType::I64))}},
                        {{"k", "v"}});
  ASSERT_TRUE(good.isOk());
  // Every truncation is an error, never a crash.
  for (size_t len = 0; len < good->size(); ++len) {
    std::vector<uint8_t> cut(good->begin(), good->begin() + long(len));
    EXPECT_FALSE(parseSafeTensors(cut).isOk()) << len;
  }
  auto withHeader = [](const std::string &h, size_t dataBytes) {
    std::vector<uint8_t> b(8);
    uint64_t n = h.size();
    std::memcpy(b.data(), &n, 8);
    b.insert(b.end(), h.begin(), h.end());
    b.resize(b.size() + dataBytes, 0);
    return b;
  };
  auto err = [](const std::vector<uint8_t> &b) {
    Expected<SafeTensorsFile> f = parseSafeTensors(b);
    return f ? std::string("<accepted>") : f.status().message();
  };
  EXPECT_EQ(err({1, 2, 3}), "truncated: 3 bytes, a safetensors file starts "
                            "with an 8-byte header length");
  std::vector<uint8_t> huge = *good;
  huge[6] = 1;
  EXPECT_TRUE(contains(err(huge), "truncated or corrupt: header length "))
      << err(huge);
  EXPECT_TRUE(contains(err(withHeader("{\"w\": {", 0)), "malformed header JSON"));
  EXPECT_EQ(err(withHeader("[]", 0)), "header: expected a JSON object, got array");
  EXPECT_EQ(err(withHeader("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],"
                           "\"data_offsets\":[0,8]}}",
                           4)),
            "tensor 'w': data_offsets [0, 8] lie outside the data (4 bytes)");
  EXPECT_EQ(err(withHeader("{\"w\":{\"dtype\":\"F32\",\"shape\":[3],"
                           "\"data_offsets\":[0,8]}}",
                           8)),
            "tensor 'w': data_offsets [0, 8] hold 8 bytes, 3xf32 needs 12");
  EXPECT_EQ(err(withHeader("{\"w\":{\"dtype\":\"F64\",\"shape\":[1],"
                           "\"data_offsets\":[0,8]}}",
                           8)),
            "tensor 'w': dtype 'F64' is not supported (supported: F32, F16, "
            "BF16, I32, I64, BOOL)");
  EXPECT_EQ(err(withHeader("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
                           "\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\","
                           "\"shape\":[1],\"data_offsets\":[4,8]}}",
                           8)),
            "tensor 'b': data_offsets [4, 8] overlap tensor 'a'");
  EXPECT_EQ(err(withHeader("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
                           "\"data_offsets\":[4,8]}}",
                           8)),
            "data bytes [0, 4) belong to no tensor");
  EXPECT_EQ(err(withHeader("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],"
                           "\"data_offsets\":[0,4]}}",
                           4)),
            "tensor 'a': shape must hold non-negative integers");
  EXPECT_EQ(err(withHeader("{\"__metadata__\":{\"k\":1}}", 0)),
            "header: __metadata__.k must be a string, got number");
  // The writer refuses an empty name, so the reader does too (a file it
  // accepted could not be written back).
  EXPECT_EQ(err(withHeader("{\"\":{\"dtype\":\"F32\",\"shape\":[1],"
                           "\"data_offsets\":[0,4]}}",
                           4)),
            "header: a tensor has an empty name");
}

//===----------------------------------------------------------------------===//
// Data loaders
//===----------------------------------------------------------------------===//

TEST(DataLoader, TokenWindowsAndWrapAround) {
  TempDir dir;
  // Tokens 0..99 as int64 .npy (V = 100 >= every id).
  HostTensor ids(tt({100}, DType::I64));
  for (int i = 0; i < 100; ++i)
    ids.setElementFromDouble(i, i);
  ASSERT_TRUE(writeNpy(dir.file("t.npy"), ids).isOk());
  Executable exe = bigramModel(100, 2, 4);
  Expected<std::unique_ptr<DataLoader>> l =
      createTokenLoader(exe, dir.file("t.npy"), TokenDType::U16);
  ASSERT_TRUE(l.isOk()) << l.status().message();
  EXPECT_EQ((*l)->inputs(), (std::vector<std::string>{"tokens", "labels"}));
  // (100 - 1) / 4 = 24 windows, 12 batches per epoch.
  EXPECT_EQ((*l)->batchesPerEpoch(), 12u);
  auto rows = [&](uint64_t index) {
    std::vector<NamedTensor> b = *(*l)->batch(index, 0);
    std::vector<int> t, y;
    for (int i = 0; i < 8; ++i) {
      t.push_back(int(b[0].tensor.elementAsDouble(i)));
      y.push_back(int(b[1].tensor.elementAsDouble(i)));
    }
    EXPECT_EQ(b[0].tensor.type, tt({2, 4}, DType::I32));
    return std::make_pair(t, y);
  };
  auto [t0, y0] = rows(0);
  EXPECT_EQ(t0, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(y0, (std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8}));
  auto [t1, y1] = rows(1);
  EXPECT_EQ(t1, (std::vector<int>{8, 9, 10, 11, 12, 13, 14, 15}));
  // Batch 12 wraps around to windows 0 and 1: epoch 1.
  EXPECT_EQ(rows(12).first, t0);
  EXPECT_EQ((*l)->epochOf(11), 0u);
  EXPECT_EQ((*l)->epochOf(12), 1u);
  EXPECT_EQ((*l)->describe(), "tokens:" + dir.file("t.npy"));
}

TEST(DataLoader, TokenFileFormatsAndErrors) {
  TempDir dir;
  Executable exe = bigramModel(16, 1, 3);
  // Raw uint16 and int32.
  std::string u16 = writeTokens(dir, 40, 16);
  Expected<std::unique_ptr<DataLoader>> a =
      createTokenLoader(exe, u16, TokenDType::U16);
  ASSERT_TRUE(a.isOk()) << a.status().message();
  std::vector<uint8_t> i32;
  for (int i = 0; i < 40; ++i) {
    int32_t v = (i * 3 + (i / 7) % 2) % 16;
    i32.insert(i32.end(), reinterpret_cast<uint8_t *>(&v),
               reinterpret_cast<uint8_t *>(&v) + 4);
  }
  writeBytes(dir.file("t32.bin"), i32);
  Expected<std::unique_ptr<DataLoader>> b =
      createTokenLoader(exe, dir.file("t32.bin"), TokenDType::I32);
  ASSERT_TRUE(b.isOk()) << b.status().message();
  EXPECT_EQ((*a)->batch(5, 0)->at(0).tensor.bytes,
            (*b)->batch(5, 0)->at(0).tensor.bytes);
  // A .npy of uint16 (dtype '<u2', which HostTensor has no type for).
  std::string hdr = "{'descr': '<u2', 'fortran_order': False, 'shape': (40,), }";
  hdr.append(128 - 10 - hdr.size() - 1, ' ');
  hdr += '\n';
  std::vector<uint8_t> npy = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                              uint8_t(hdr.size()), 0};
  npy.insert(npy.end(), hdr.begin(), hdr.end());
  std::ifstream in(u16, std::ios::binary);
  npy.insert(npy.end(), std::istreambuf_iterator<char>(in), {});
  writeBytes(dir.file("u2.npy"), npy);
  Expected<std::unique_ptr<DataLoader>> c =
      createTokenLoader(exe, dir.file("u2.npy"), TokenDType::I32);
  ASSERT_TRUE(c.isOk()) << c.status().message();
  EXPECT_EQ((*a)->batch(3, 0)->at(1).tensor.bytes,
            (*c)->batch(3, 0)->at(1).tensor.bytes);

  // Ids beyond the vocabulary (16 = gather table rows) are caught on load.
  Executable small = bigramModel(8, 1, 3);
  Expected<std::unique_ptr<DataLoader>> bad =
      createTokenLoader(small, u16, TokenDType::U16);
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().message(),
            u16 + ": token 9 at position 3 is outside the model's vocabulary "
                  "[0, 8)");
  writeBytes(dir.file("odd.bin"), {1, 2, 3});
  EXPECT_TRUE(contains(
      createTokenLoader(exe, dir.file("odd.bin"), TokenDType::U16)
          .status()
          .message(),
      "is not a multiple of the token size 2"));
  writeBytes(dir.file("short.bin"), {1, 0, 2, 0});
  EXPECT_EQ(createTokenLoader(exe, dir.file("short.bin"), TokenDType::U16)
                .status()
                .message(),
            dir.file("short.bin") + ": 2 tokens, but one window of the input "
                                    "'tokens' (1x3xi32) needs seq + 1 = 4");
  EXPECT_TRUE(contains(createTokenLoader(exe, dir.file("none.bin"),
                                         TokenDType::U16)
                           .status()
                           .message(),
                       "No such file or directory"));
  EXPECT_TRUE(contains(
      createTokenLoader(classifierModel(2, 3, 4), u16, TokenDType::U16)
          .status()
          .message(),
      "--data feeds the input 'tokens', which the model does not have"));
}

// Regular token files are mapped and decoded a window at a time; a pipe
// is read whole. Both give the same batches, and a bad id in a mapped file
// is reported as the whole-file path reports it.
TEST(DataLoader, MappedAndStreamedTokenFilesAgree) {
  TempDir dir;
  Executable exe = bigramModel(16, 2, 5);
  std::string u16 = writeTokens(dir, 97, 16);
  std::vector<uint8_t> bytes;
  {
    std::ifstream in(u16, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::string fifo = dir.file("tokens.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::thread writer([&] {
    std::ofstream out(fifo, std::ios::binary);
    out.write(reinterpret_cast<const char *>(bytes.data()),
              std::streamsize(bytes.size()));
  });
  Expected<std::unique_ptr<DataLoader>> streamed =
      createTokenLoader(exe, fifo, TokenDType::U16);
  writer.join();
  ASSERT_TRUE(streamed.isOk()) << streamed.status().message();
  Expected<std::unique_ptr<DataLoader>> mapped =
      createTokenLoader(exe, u16, TokenDType::U16);
  ASSERT_TRUE(mapped.isOk()) << mapped.status().message();
  EXPECT_EQ((*mapped)->batchesPerEpoch(), (*streamed)->batchesPerEpoch());
  for (uint64_t i : {0u, 1u, 7u, 9u, 31u})
    for (size_t k : {0u, 1u})
      EXPECT_EQ((*mapped)->batch(i, 0)->at(k).tensor.bytes,
                (*streamed)->batch(i, 0)->at(k).tensor.bytes)
          << "batch " << i << ", input " << k;
  // A negative id in a raw int32 file.
  std::vector<uint8_t> i32;
  for (int32_t v : {1, 2, -5, 3, 4, 5, 6, 7}) {
    i32.insert(i32.end(), reinterpret_cast<uint8_t *>(&v),
               reinterpret_cast<uint8_t *>(&v) + 4);
  }
  writeBytes(dir.file("neg.bin"), i32);
  EXPECT_EQ(createTokenLoader(bigramModel(16, 1, 3), dir.file("neg.bin"),
                              TokenDType::I32)
                .status()
                .message(),
            dir.file("neg.bin") +
                ": (raw int32 tokens): token -5 at position 2 is not a valid "
                "id");
}

TEST(DataLoader, ArraysShuffleDeterministicallyPerEpoch) {
  TempDir dir;
  writeClassifierData(dir, 10, 3, 4, "");
  Executable exe = classifierModel(4, 3, 4);
  std::vector<std::pair<std::string, std::string>> files = {
      {"images", dir.file("images.npy")}, {"labels", dir.file("labels.npy")}};
  Expected<std::unique_ptr<DataLoader>> l = createArrayLoader(exe, files, true);
  ASSERT_TRUE(l.isOk()) << l.status().message();
  EXPECT_EQ((*l)->batchesPerEpoch(), 2u); // 10 / 4, the rest dropped
  Expected<HostTensor> images = readNpy(dir.file("images.npy"));
  // Which sample each row of a batch is, from its image row.
  auto samples = [&](const DataLoader &loader, uint64_t index, uint64_t seed) {
    std::vector<NamedTensor> b = *loader.batch(index, seed);
    EXPECT_EQ(b[1].tensor.type, tt({4}, DType::I32)); // converted from i64
    std::vector<int> ids;
    for (int r = 0; r < 4; ++r) {
      int found = -1;
      for (int i = 0; i < 10; ++i)
        if (std::memcmp(b[0].tensor.bytes.data() + r * 12,
                        images->bytes.data() + i * 12, 12) == 0)
          found = i;
      EXPECT_GE(found, 0);
      EXPECT_EQ(b[1].tensor.elementAsDouble(r), double((found * 7 + 3) % 4));
      ids.push_back(found);
    }
    return ids;
  };
  std::vector<int> e0b0 = samples(**l, 0, 1), e0b1 = samples(**l, 1, 1);
  std::set<int> epoch0(e0b0.begin(), e0b0.end());
  epoch0.insert(e0b1.begin(), e0b1.end());
  EXPECT_EQ(epoch0.size(), 8u); // no sample twice in an epoch
  EXPECT_EQ(samples(**l, 0, 1), e0b0); // deterministic
  EXPECT_NE(samples(**l, 2, 1), e0b0); // next epoch, other order
  EXPECT_NE(samples(**l, 0, 2), e0b0); // other seed, other order
  Expected<std::unique_ptr<DataLoader>> plain =
      createArrayLoader(exe, files, false);
  EXPECT_EQ(samples(**plain, 1, 1), (std::vector<int>{4, 5, 6, 7}));
  // A permutation is a permutation.
  std::vector<uint64_t> p = shuffledIndices(1000, 42);
  EXPECT_EQ(std::set<uint64_t>(p.begin(), p.end()).size(), 1000u);

  // Errors name the file and the input.
  std::vector<std::pair<std::string, std::string>> bad = {
      {"images", dir.file("labels.npy")}};
  EXPECT_EQ(createArrayLoader(exe, bad, true).status().message(),
            "images=" + dir.file("labels.npy") +
                ": expected N samples of 3xf32 (input 'images' is 4x3xf32), "
                "got 10xi64");
  bad = {{"pixels", dir.file("images.npy")}};
  EXPECT_TRUE(contains(createArrayLoader(exe, bad, true).status().message(),
                       "the model has no input 'pixels'"));
  Executable big = classifierModel(16, 3, 4);
  EXPECT_EQ(createArrayLoader(big, files, true).status().message(),
            "the arrays hold 10 samples, fewer than one batch (16)");
}

/// Checks that `part` is `whole` inside `box` and zero outside it.
void expectRegionOf(const HostTensor &whole, const HostTensor &part,
                    const Box &box, const std::string &what) {
  ASSERT_EQ(whole.type, part.type) << what;
  const std::vector<int64_t> &shape = whole.type.shape;
  int64_t n = whole.numElements(), inside = 0;
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t rem = i;
    for (size_t d = shape.size(); d-- > 0;) {
      idx[d] = rem % shape[d];
      rem /= shape[d];
    }
    bool in = true;
    for (size_t d = 0; d < shape.size(); ++d)
      in = in && idx[d] >= box.lo[d] && idx[d] < box.hi[d];
    inside += in;
    if (in)
      EXPECT_EQ(part.elementAsDouble(i), whole.elementAsDouble(i))
          << what << ": element " << i << " inside the box";
    else
      EXPECT_EQ(part.elementAsDouble(i), 0.0)
          << what << ": element " << i << " outside the box was filled";
  }
  EXPECT_GT(n, inside) << what << ": the box should leave something out";
}

// A process of a multi-process run fills only the part of each batch its
// ranks hold (StepRunner::inputRegion); inside it, a restricted batch is
// the unrestricted one, for every loader, and the rest stays zero.
TEST(DataLoader, RestrictedBatchesAreTheirRegionOfTheWholeBatch) {
  TempDir dir;
  // Tokens [3, 5]: rows 1..2, positions 1..3; labels: row 0 only.
  Executable lm = bigramModel(16, 3, 5);
  std::string u16 = writeTokens(dir, 97, 16);
  Box tokBox{{1, 1}, {3, 4}}, labBox{{0, 0}, {1, 5}};
  Expected<std::unique_ptr<DataLoader>> whole =
      createTokenLoader(lm, u16, TokenDType::U16);
  Expected<std::unique_ptr<DataLoader>> part =
      createTokenLoader(lm, u16, TokenDType::U16);
  ASSERT_TRUE(whole.isOk() && part.isOk()) << part.status().message();
  (*part)->restrictTo("tokens", tokBox);
  (*part)->restrictTo("labels", labBox);
  for (uint64_t i : {0u, 3u, 6u, 40u}) {
    std::vector<NamedTensor> a = *(*whole)->batch(i, 0), b = *(*part)->batch(i, 0);
    expectRegionOf(a[0].tensor, b[0].tensor, tokBox, "tokens");
    expectRegionOf(a[1].tensor, b[1].tensor, labBox, "labels");
  }

  // Arrays: images rows 2..3 of a batch of 4; no labels at all.
  writeClassifierData(dir, 10, 3, 4, "");
  Executable cls = classifierModel(4, 3, 4);
  std::vector<std::pair<std::string, std::string>> files = {
      {"images", dir.file("images.npy")}, {"labels", dir.file("labels.npy")}};
  Expected<std::unique_ptr<DataLoader>> wa = createArrayLoader(cls, files, true);
  Expected<std::unique_ptr<DataLoader>> pa = createArrayLoader(cls, files, true);
  ASSERT_TRUE(wa.isOk() && pa.isOk()) << pa.status().message();
  Box imgBox{{2, 0}, {4, 3}}, none{{0}, {0}};
  (*pa)->restrictTo("images", imgBox);
  (*pa)->restrictTo("labels", none);
  for (uint64_t i : {0u, 1u, 2u, 5u}) {
    std::vector<NamedTensor> a = *(*wa)->batch(i, 3), b = *(*pa)->batch(i, 3);
    expectRegionOf(a[0].tensor, b[0].tensor, imgBox, "images");
    EXPECT_EQ(b[1].tensor.bytes, std::vector<uint8_t>(b[1].tensor.bytes.size()))
        << "labels no rank of this process holds were read";
  }

  // Synthetic data draws the same values inside the box.
  Expected<std::unique_ptr<DataLoader>> ws =
      createSyntheticLoader(cls, {"images", "labels"}, 0);
  Expected<std::unique_ptr<DataLoader>> ps =
      createSyntheticLoader(cls, {"images", "labels"}, 0);
  ASSERT_TRUE(ws.isOk() && ps.isOk());
  Box synBox{{1, 1}, {3, 3}}, labRows{{3}, {4}};
  (*ps)->restrictTo("images", synBox);
  (*ps)->restrictTo("labels", labRows);
  for (uint64_t i : {0u, 7u}) {
    std::vector<NamedTensor> a = *(*ws)->batch(i, 5), b = *(*ps)->batch(i, 5);
    expectRegionOf(a[0].tensor, b[0].tensor, synBox, "synthetic images");
    expectRegionOf(a[1].tensor, b[1].tensor, labRows, "synthetic labels");
  }
}

// Mapped arrays (regular files) and arrays read whole (a pipe) give the
// same batches, conversions included (i64 labels to i32, f32 to bf16).
TEST(DataLoader, MappedAndStreamedArraysAgree) {
  TempDir dir;
  writeClassifierData(dir, 9, 3, 4, "");
  std::vector<uint8_t> bytes;
  {
    std::ifstream in(dir.file("images.npy"), std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::string fifo = dir.file("images.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (DType images : {DType::F32, DType::BF16}) {
    Executable exe = classifierModel(2, 3, 4);
    for (int32_t id : exe.inputs)
      if (exe.values[id].name == "images")
        exe.values[id].type.dtype = images;
    std::thread writer([&] {
      std::ofstream out(fifo, std::ios::binary);
      out.write(reinterpret_cast<const char *>(bytes.data()),
                std::streamsize(bytes.size()));
    });
    Expected<std::unique_ptr<DataLoader>> streamed = createArrayLoader(
        exe, {{"images", fifo}, {"labels", dir.file("labels.npy")}}, true);
    writer.join();
    ASSERT_TRUE(streamed.isOk()) << streamed.status().message();
    Expected<std::unique_ptr<DataLoader>> mapped = createArrayLoader(
        exe,
        {{"images", dir.file("images.npy")},
         {"labels", dir.file("labels.npy")}},
        true);
    ASSERT_TRUE(mapped.isOk()) << mapped.status().message();
    for (uint64_t i : {0u, 1u, 4u, 9u})
      for (size_t k : {0u, 1u}) {
        std::vector<NamedTensor> a = *(*mapped)->batch(i, 2),
                                 b = *(*streamed)->batch(i, 2);
        EXPECT_EQ(a[k].tensor.type, b[k].tensor.type);
        EXPECT_EQ(a[k].tensor.bytes, b[k].tensor.bytes)
            << "batch " << i << ", input " << k;
      }
  }
}

// An input of K micro-batches [K, B, ...] takes K*B samples a step, the
// samples a [K*B, ...] input would take (as token windows do), so
// accumulation never changes the data; a box restricts both leading dims.
TEST(DataLoader, ArraysFeedMicroBatchesLikeOneBatch) {
  TempDir dir;
  writeClassifierData(dir, 13, 3, 4, "");
  std::vector<std::pair<std::string, std::string>> files = {
      {"images", dir.file("images.npy")}, {"labels", dir.file("labels.npy")}};
  Executable one = classifierModel(6, 3, 4), acc = one;
  for (int32_t id : acc.inputs) {
    TensorType &t = acc.values[id].type;
    t.shape.insert(t.shape.begin(), 2);
    t.shape[1] = 3; // [2, 3, ...]: K = 2 micro-batches of 3
  }
  Expected<std::unique_ptr<DataLoader>> a = createArrayLoader(one, files, true);
  Expected<std::unique_ptr<DataLoader>> b = createArrayLoader(acc, files, true);
  ASSERT_TRUE(a.isOk() && b.isOk()) << b.status().message();
  EXPECT_EQ((*b)->batchesPerEpoch(), 2u);
  for (uint64_t i : {0u, 1u, 2u, 7u})
    for (size_t k : {0u, 1u}) {
      NamedTensor x = (*a)->batch(i, 4)->at(k), y = (*b)->batch(i, 4)->at(k);
      EXPECT_EQ(y.tensor.type, acc.values[acc.inputs[k]].type);
      EXPECT_EQ(x.tensor.bytes, y.tensor.bytes) << "batch " << i;
    }
  Expected<std::unique_ptr<DataLoader>> part = createArrayLoader(acc, files, true);
  Box half{{0, 1, 0}, {2, 3, 3}};
  (*part)->restrictTo("images", half);
  expectRegionOf((*b)->batch(3, 4)->at(0).tensor,
                 (*part)->batch(3, 4)->at(0).tensor, half, "micro-batch rows");
  // Samples shaped like neither [B, ...] nor [K, B, ...] are refused.
  Executable wrong = classifierModel(6, 5, 4);
  EXPECT_TRUE(contains(createArrayLoader(wrong, files, true).status().message(),
                       "expected N samples of 5xf32"));
}

// Under a launcher each process checks its share of a data file at load;
// a bad element is reported by the process whose share holds it.
TEST(DataLoader, LoadTimeChecksCoverTheirShare) {
  TempDir dir;
  std::string u16 = writeTokens(dir, 40, 16); // token 9 at position 3
  Executable small = bigramModel(8, 1, 3);
  EXPECT_FALSE(
      createTokenLoader(small, u16, TokenDType::U16, {0, 4}).isOk());
  // Share 3 of 4 (positions 30..39) reports its own first bad id.
  Expected<std::unique_ptr<DataLoader>> s3 =
      createTokenLoader(small, u16, TokenDType::U16, {3, 4});
  ASSERT_FALSE(s3.isOk());
  EXPECT_TRUE(contains(s3.status().message(), "token 10 at position 30 is"))
      << s3.status().message();
  // Tokens 0..7 in share 1 of 2 only: share 0 passes, share 1 fails.
  std::vector<uint8_t> b;
  for (int i = 0; i < 40; ++i) {
    uint16_t t = uint16_t(i < 20 ? i % 8 : 8 + i % 8);
    b.push_back(uint8_t(t));
    b.push_back(uint8_t(t >> 8));
  }
  writeBytes(dir.file("halves.bin"), b);
  EXPECT_TRUE(
      createTokenLoader(small, dir.file("halves.bin"), TokenDType::U16, {0, 2})
          .isOk());
  Expected<std::unique_ptr<DataLoader>> s1 = createTokenLoader(
      small, dir.file("halves.bin"), TokenDType::U16, {1, 2});
  ASSERT_FALSE(s1.isOk());
  EXPECT_EQ(s1.status().message(),
            dir.file("halves.bin") + ": token 12 at position 20 is outside the "
                                     "model's vocabulary [0, 8)");

  // An i64 label that does not fit i32, in the second half.
  HostTensor x(tt({6, 3})), y(tt({6}, DType::I64));
  for (int i = 0; i < 6; ++i)
    y.setElementFromDouble(i, i == 4 ? 1e12 : i % 4);
  ASSERT_TRUE(writeNpy(dir.file("x.npy"), x).isOk());
  ASSERT_TRUE(writeNpy(dir.file("y.npy"), y).isOk());
  Executable cls = classifierModel(2, 3, 4);
  std::vector<std::pair<std::string, std::string>> files = {
      {"images", dir.file("x.npy")}, {"labels", dir.file("y.npy")}};
  EXPECT_TRUE(createArrayLoader(cls, files, true, {0, 2}).isOk());
  EXPECT_EQ(createArrayLoader(cls, files, true, {1, 2}).status().message(),
            "labels=" + dir.file("y.npy") +
                ": element 4 does not fit the input's i32");
  EXPECT_FALSE(createArrayLoader(cls, files, true).isOk());
}

/// The standard normal quantile at u in (0, 1), by Newton's method on
/// erfc in double precision: the reference syntheticNormal approximates.
double normalQuantile(double u) {
  double z = 0;
  for (int it = 0; it < 100; ++it) {
    double cdf = 0.5 * std::erfc(-z / std::sqrt(2.0));
    double pdf = std::exp(-0.5 * z * z) / std::sqrt(2.0 * M_PI);
    double step = (cdf - u) / pdf;
    z -= step;
    if (std::abs(step) < 1e-14)
      break;
  }
  return z;
}

TEST(DataLoader, SyntheticFloatsAreNormalQuantiles) {
  // Each word's top 24 bits k pick the quantile at (k + 1/2) / 2^24.
  std::vector<uint64_t> ks = {0, 1, 2, 3, 100, 4095, 1u << 23, (1u << 23) - 1,
                              (1u << 24) - 1, (1u << 24) - 2, (1u << 24) - 101};
  for (uint64_t i = 0; i < 4000; ++i)
    ks.push_back(dataKey(5, 2, i) >> 40);
  for (uint64_t k : ks) {
    // The low 40 bits do not matter.
    uint64_t word = k << 40 | (dataKey(6, 2, k) >> 24);
    double u = (double(k) + 0.5) * 0x1.0p-24;
    double z = syntheticNormal(word);
    EXPECT_NEAR(z, normalQuantile(u), 2e-6) << "k = " << k;
    // Symmetric, exactly.
    uint64_t mirror = ((uint64_t(1) << 24) - 1 - k) << 40;
    EXPECT_EQ(syntheticNormal(mirror), -syntheticNormal(word)) << "k = " << k;
  }

  // Over a stream: the moments and tails of a standard normal.
  const int n = 1 << 20;
  double sum = 0, sq = 0, four = 0;
  int tails = 0;
  for (int i = 0; i < n; ++i) {
    double z = syntheticNormal(initWord(dataKey(1, 2, 0), uint64_t(i)));
    sum += z;
    sq += z * z;
    four += z * z * z * z;
    tails += std::abs(z) > 1.959963985;
  }
  EXPECT_NEAR(sum / n, 0.0, 5e-3);
  EXPECT_NEAR(sq / n, 1.0, 5e-3);
  EXPECT_NEAR(four / n, 3.0, 3e-2);
  EXPECT_NEAR(double(tails) / n, 0.05, 1.5e-3);
}

TEST(DataLoader, SyntheticIsDeterministicAndInRange) {
  Executable exe = bigramModel(7, 2, 5);
  EXPECT_EQ(inferIntRange(exe, exe.inputs[0]), 7); // gather table rows
  EXPECT_EQ(inferIntRange(exe, exe.inputs[1]), 7); // cross_entropy classes
  Expected<std::unique_ptr<DataLoader>> l =
      createSyntheticLoader(exe, {"tokens", "labels"}, 0);
  ASSERT_TRUE(l.isOk()) << l.status().message();
  std::vector<NamedTensor> a = *(*l)->batch(3, 9);
  EXPECT_EQ(a[0].tensor.bytes, (*l)->batch(3, 9)->at(0).tensor.bytes);
  EXPECT_NE(a[0].tensor.bytes, (*l)->batch(4, 9)->at(0).tensor.bytes);
  EXPECT_NE(a[0].tensor.bytes, (*l)->batch(3, 10)->at(0).tensor.bytes);
  EXPECT_NE(a[0].tensor.bytes, a[1].tensor.bytes);
  std::set<int> seen;
  for (uint64_t b = 0; b < 20; ++b) {
    std::vector<NamedTensor> batch = *(*l)->batch(b, 9);
    for (const NamedTensor &t : batch)
      for (int64_t i = 0; i < 10; ++i) {
        double v = t.tensor.elementAsDouble(i);
        EXPECT_TRUE(v >= 0 && v < 7) << v;
        seen.insert(int(v));
      }
  }
  EXPECT_EQ(seen.size(), 7u);

  // Floats are standard normals.
  Executable cls = classifierModel(64, 8, 3);
  Expected<std::unique_ptr<DataLoader>> f =
      createSyntheticLoader(cls, {"images", "labels"}, 0);
  ASSERT_TRUE(f.isOk()) << f.status().message();
  HostTensor x = (*f)->batch(0, 1)->at(0).tensor;
  TensorStats st = computeStats(x);
  EXPECT_NEAR(st.mean, 0.0, 0.2);
  EXPECT_GT(st.max, 1.0);
  EXPECT_LT(st.min, -1.0);

  // An int input nothing bounds needs --vocab.
  ExeBuilder b;
  int32_t in = b.input("ids", tt({4}, DType::I32));
  b.output("y", b.op("neg", {in}, tt({4}, DType::I32)));
  Executable free = b.build();
  EXPECT_FALSE(inferIntRange(free, in).has_value());
  EXPECT_TRUE(contains(createSyntheticLoader(free, {"ids"}, 0).status().message(),
                       "pass --vocab V"));
  Expected<std::unique_ptr<DataLoader>> v = createSyntheticLoader(free, {"ids"}, 3);
  ASSERT_TRUE(v.isOk());
  for (int64_t i = 0; i < 4; ++i)
    EXPECT_LT((*v)->batch(0, 0)->at(0).tensor.elementAsDouble(i), 3);
}

//===----------------------------------------------------------------------===//
// Checkpoints and resume
//===----------------------------------------------------------------------===//

TEST(Checkpoint, RoundTripAndMetadata) {
  TempDir dir;
  auto s = makeSession(bigramModel(6, 1, 4), 5);
  ASSERT_TRUE(s);
  CheckpointState st{42, 17, 3, 99, "tokens:x.bin"};
  std::string path = dir.file(checkpointFileName(42));
  EXPECT_EQ(checkpointFileName(42), "step-000042.safetensors");
  ASSERT_TRUE(saveCheckpoint(*s, path, st).isOk());
  Expected<SafeTensorsFile> f = readSafeTensors(path);
  ASSERT_TRUE(f.isOk()) << f.status().message();
  EXPECT_EQ(f->metadata.at("format"), "dlopt-checkpoint");
  EXPECT_EQ(f->metadata.at("version"), "1");
  EXPECT_EQ(f->metadata.at("step"), "42");
  EXPECT_EQ(f->metadata.at("data_position"), "17");
  EXPECT_EQ(f->metadata.at("rng_seed"), "99");
  EXPECT_EQ(f->metadata.at("world_size"), "1");
  EXPECT_EQ(f->metadata.at("fingerprint"), modelFingerprint(s->executable()));
  nlohmann::json tensors = nlohmann::json::parse(f->metadata.at("tensors"));
  EXPECT_EQ(tensors["table"]["role"], "param");
  EXPECT_EQ(tensors["sgd.m.table"]["role"], "state");
  EXPECT_EQ(tensors["step"]["sharding"], "replicated");
  EXPECT_EQ(f->tensors.size(), 3u);
  EXPECT_EQ(f->find("step")->type, tt({}, DType::I64));
  // No temporary file is left behind.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path), {}), 1);

  auto t = makeSession(bigramModel(6, 1, 4), 6); // other init
  Expected<CheckpointState> back = loadCheckpoint(*t, path);
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(back->step, 42);
  EXPECT_EQ(back->dataPosition, 17u);
  EXPECT_EQ(back->rngSeed, 99u);
  EXPECT_EQ(back->dataSource, "tokens:x.bin");
  EXPECT_EQ(t->readArgument("table")->bytes, s->readArgument("table")->bytes);
}

TEST(Checkpoint, MismatchAndCorruptionChangeNothing) {
  TempDir dir;
  auto s = makeSession(bigramModel(6, 1, 4), 5);
  std::string path = dir.file("c.safetensors");
  ASSERT_TRUE(saveCheckpoint(*s, path, {}).isOk());

  auto other = makeSession(bigramModel(7, 1, 4), 1);
  ASSERT_TRUE(other->initializeParams().isOk());
  HostTensor before = *other->readArgument("table");
  Expected<CheckpointState> r = loadCheckpoint(*other, path);
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().message(),
            "checkpoint " + path + ": does not match this model (saved from "
            "'test_model'): param 'table': expected 7x7xf32, got 6x6xf32");
  EXPECT_EQ(other->readArgument("table")->bytes, before.bytes);

  auto cls = makeSession(classifierModel(2, 3, 4));
  r = loadCheckpoint(*cls, path);
  EXPECT_EQ(r.status().message(),
            "checkpoint " + path + ": does not match this model (saved from "
            "'test_model'): param 'W' (3x4xf32) is missing");

  // A model with fewer tensors: the extra one is named.
  Executable noMomentum = bigramModel(6, 1, 4);
  ExeBuilder b;
  int32_t p = b.param("table", tt({6, 6}));
  b.output("loss", b.op("sum", {p}, tt({}), reduceAll(2)));
  auto fewer = makeSession(b.build());
  r = loadCheckpoint(*fewer, path);
  EXPECT_EQ(r.status().message(),
            "checkpoint " + path + ": does not match this model (saved from "
            "'test_model'): tensor 'sgd.m.table' (6x6xf32) is not a param or "
            "state of this model");

  // Truncated and corrupt files.
  std::vector<uint8_t> bytes = *readFileBytes(path);
  std::vector<uint8_t> cut(bytes.begin(), bytes.end() - 3);
  writeBytes(dir.file("cut.safetensors"), cut);
  r = loadCheckpoint(*other, dir.file("cut.safetensors"));
  EXPECT_TRUE(contains(r.status().message(), "lie outside the data"))
      << r.status().message();
  std::vector<uint8_t> junk = bytes;
  junk[0] = 0xff;
  junk[5] = 0x7f;
  writeBytes(dir.file("junk.safetensors"), junk);
  r = loadCheckpoint(*other, dir.file("junk.safetensors"));
  EXPECT_TRUE(contains(r.status().message(), "truncated or corrupt: header "
                                             "length"))
      << r.status().message();
  std::vector<uint8_t> json = bytes;
  json[8] = '[';
  writeBytes(dir.file("json.safetensors"), json);
  r = loadCheckpoint(*other, dir.file("json.safetensors"));
  EXPECT_TRUE(contains(r.status().message(), "malformed header JSON"))
      << r.status().message();
  r = loadCheckpoint(*other, dir.file("missing.safetensors"));
  EXPECT_EQ(r.status().message(), "checkpoint " + dir.file("missing.safetensors") +
                                      ": No such file or directory");
  EXPECT_EQ(other->readArgument("table")->bytes, before.bytes);
}

namespace {

/// Runs `steps` steps of the bigram model on token data, optionally
/// resuming from / checkpointing to a file; returns the trainer's history.
std::vector<StepResult> trainBigram(const std::string &tokens, int64_t steps,
                                    const std::string &resume,
                                    const std::string &saveTo,
                                    std::vector<uint8_t> *finalTable = nullptr) {
  auto s = makeSession(bigramModel(16, 2, 5), 7);
  Expected<std::unique_ptr<DataLoader>> l =
      createTokenLoader(s->executable(), tokens, TokenDType::U16);
  EXPECT_TRUE(l.isOk()) << l.status().message();
  Expected<std::unique_ptr<Trainer>> t =
      Trainer::create(*s, **l, nullptr, quietOptions(steps));
  EXPECT_TRUE(t.isOk()) << t.status().message();
  if (!resume.empty())
    EXPECT_TRUE((*t)->resume(resume).isOk());
  Status st = (*t)->run();
  EXPECT_TRUE(st.isOk()) << st.message();
  if (!saveTo.empty())
    EXPECT_TRUE((*t)->checkpointTo(saveTo).isOk());
  if (finalTable)
    *finalTable = s->readArgument("table")->bytes;
  return (*t)->history();
}

} // namespace

TEST(Trainer, ResumeIsBitwiseIdentical) {
  TempDir dir;
  // 11 windows of 5: 5 batches of 2 per epoch, so 8 steps wrap around.
  std::string tokens = writeTokens(dir, 56, 16);
  std::vector<uint8_t> tableA, tableB;
  std::vector<StepResult> full = trainBigram(tokens, 8, "", "", &tableA);
  ASSERT_EQ(full.size(), 8u);
  EXPECT_LT(full.back().loss, full.front().loss);
  std::string ckpt = dir.file("half.safetensors");
  std::vector<StepResult> first = trainBigram(tokens, 4, "", ckpt);
  std::vector<StepResult> second = trainBigram(tokens, 4, ckpt, "", &tableB);
  ASSERT_EQ(second.size(), 4u);
  EXPECT_EQ(second.front().step, 5);
  std::vector<StepResult> joined = first;
  joined.insert(joined.end(), second.begin(), second.end());
  EXPECT_EQ(lossBits(joined), lossBits(full));
  EXPECT_EQ(tableA, tableB);
}

TEST(Trainer, ResumeWithShuffledArraysIsBitwiseIdentical) {
  TempDir dir;
  writeClassifierData(dir, 10, 3, 4, "");
  auto train = [&](int64_t steps, const std::string &resume,
                   const std::string &saveTo) {
    auto s = makeSession(classifierModel(4, 3, 4), 2);
    Expected<std::unique_ptr<DataLoader>> l = createArrayLoader(
        s->executable(),
        {{"images", dir.file("images.npy")}, {"labels", dir.file("labels.npy")}},
        true);
    EXPECT_TRUE(l.isOk()) << l.status().message();
    TrainerOptions o = quietOptions(steps);
    o.seed = 11;
    Expected<std::unique_ptr<Trainer>> t = Trainer::create(*s, **l, nullptr, o);
    EXPECT_TRUE(t.isOk()) << t.status().message();
    if (!resume.empty())
      EXPECT_TRUE((*t)->resume(resume).isOk());
    EXPECT_TRUE((*t)->run().isOk());
    if (!saveTo.empty())
      EXPECT_TRUE((*t)->checkpointTo(saveTo).isOk());
    return (*t)->history();
  };
  std::vector<StepResult> full = train(6, "", "");
  std::string ckpt = dir.file("c.safetensors");
  std::vector<StepResult> a = train(3, "", ckpt); // stops mid-epoch
  std::vector<StepResult> b = train(3, ckpt, "");
  a.insert(a.end(), b.begin(), b.end());
  EXPECT_EQ(lossBits(a), lossBits(full));
}

namespace {

/// Forwards to a loader and records each batch() call: its index, whether
/// it ran off the calling (training) thread, and whether two calls ever
/// overlapped.
class RecordingLoader final : public DataLoader {
public:
  RecordingLoader(const DataLoader &inner, std::thread::id main)
      : inner_(inner), main_(main) {}
  Expected<std::vector<NamedTensor>> batch(uint64_t index,
                                           uint64_t seed) const override {
    if (inFlight_.fetch_add(1) != 0)
      overlapped_ = true;
    // Long enough that a step would catch a prefetch still running.
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    auto b = inner_.batch(index, seed);
    {
      std::lock_guard<std::mutex> g(mu_);
      calls_.push_back({index, std::this_thread::get_id() != main_});
    }
    inFlight_.fetch_sub(1);
    return b;
  }
  std::vector<std::string> inputs() const override { return inner_.inputs(); }
  uint64_t batchesPerEpoch() const override { return inner_.batchesPerEpoch(); }
  uint64_t epochOf(uint64_t i) const override { return inner_.epochOf(i); }
  std::string describe() const override { return inner_.describe(); }

  const DataLoader &inner_;
  std::thread::id main_;
  mutable std::atomic<int> inFlight_{0};
  mutable std::atomic<bool> overlapped_{false};
  mutable std::mutex mu_;
  mutable std::vector<std::pair<uint64_t, bool>> calls_; // index, off-thread
};

} // namespace

TEST(Trainer, PrefetchesTheNextBatchInTheBackground) {
  // Batch i+1 is drawn on another thread while step i runs, one batch()
  // call at a time, and training sees exactly the batches it would without
  // the prefetch: the loss history equals a run that binds each step's
  // batch itself (resuming every step: a resume discards the prefetch).
  TempDir dir;
  writeClassifierData(dir, 12, 3, 4, "");
  auto loaderFor = [&](Session &s) {
    return createArrayLoader(
        s.executable(),
        {{"images", dir.file("images.npy")}, {"labels", dir.file("labels.npy")}},
        true);
  };
  auto s = makeSession(classifierModel(4, 3, 4), 2);
  auto inner = loaderFor(*s);
  ASSERT_TRUE(inner.isOk()) << inner.status().message();
  RecordingLoader rec(**inner, std::this_thread::get_id());
  TrainerOptions o = quietOptions(5);
  o.seed = 3;
  auto t = Trainer::create(*s, rec, nullptr, o);
  ASSERT_TRUE(t.isOk()) << t.status().message();
  ASSERT_TRUE((*t)->run().isOk());
  std::vector<StepResult> prefetched = (*t)->history();
  t->reset(); // waits for the last prefetch
  EXPECT_FALSE(rec.overlapped_.load());
  ASSERT_EQ(rec.calls_.size(), 6u); // steps 1-5 and the prefetched 6th
  for (size_t i = 0; i < rec.calls_.size(); ++i) {
    EXPECT_EQ(rec.calls_[i].first, i);
    EXPECT_EQ(rec.calls_[i].second, i > 0) << "batch " << i;
  }
  // One step per trainer, each resumed from the last: no prefetch is used.
  std::vector<StepResult> direct;
  std::string ckpt = dir.file("p.safetensors");
  for (int k = 0; k < 5; ++k) {
    auto s2 = makeSession(classifierModel(4, 3, 4), 2);
    auto l2 = loaderFor(*s2);
    ASSERT_TRUE(l2.isOk());
    TrainerOptions o2 = quietOptions(1);
    o2.seed = 3;
    auto t2 = Trainer::create(*s2, **l2, nullptr, o2);
    ASSERT_TRUE(t2.isOk());
    if (k > 0)
      ASSERT_TRUE((*t2)->resume(ckpt).isOk());
    ASSERT_TRUE((*t2)->run().isOk());
    ASSERT_TRUE((*t2)->checkpointTo(ckpt).isOk());
    direct.push_back((*t2)->history().back());
  }
  EXPECT_EQ(lossBits(direct), lossBits(prefetched));
}

TEST(Trainer, NonFiniteLossStopsUnlessLossScaled) {
  auto s = makeSession(divergingModel(false));
  Expected<std::unique_ptr<DataLoader>> none =
      createSyntheticLoader(s->executable(), {}, 0);
  Expected<std::unique_ptr<Trainer>> t =
      Trainer::create(*s, **none, nullptr, quietOptions(5));
  ASSERT_TRUE(t.isOk()) << t.status().message();
  Status st = (*t)->run();
  EXPECT_EQ(st.message(), "loss is nan at step 3; stopping (nothing from "
                          "this step is saved)");
  EXPECT_EQ((*t)->stepCount(), 2);
  EXPECT_TRUE((*t)->history().back().diverged);
  // The diverged step's in-place updates may have changed the in-memory
  // weights; what matters is that no checkpoint or parameter file takes them
  // (the CLI test checks that nothing is written).

  auto scaled = makeSession(divergingModel(true));
  Expected<std::unique_ptr<Trainer>> u =
      Trainer::create(*scaled, **none, nullptr, quietOptions(5));
  ASSERT_TRUE(u.isOk());
  ASSERT_TRUE((*u)->run().isOk());
  const std::vector<StepResult> &h = (*u)->history();
  ASSERT_EQ(h.size(), 5u);
  // This toy plan halves its scale at every step; the trainer reads a
  // falling scale as a step the plan skipped (what compiled fp16 plans do),
  // and a non-finite loss is always a skip.
  EXPECT_TRUE(h[1].skipped);
  EXPECT_TRUE(h[2].skipped);
  EXPECT_EQ(*h[4].lossScale, 1024.0 / 32);
}

TEST(Trainer, MetricsJsonlAndEvaluation) {
  TempDir dir;
  writeClassifierData(dir, 24, 4, 3, "");
  writeClassifierData(dir, 8, 4, 3, "eval_");
  auto s = makeSession(classifierModel(8, 4, 3), 1);
  Expected<std::unique_ptr<DataLoader>> train = createArrayLoader(
      s->executable(),
      {{"images", dir.file("images.npy")}, {"labels", dir.file("labels.npy")}},
      true);
  Expected<std::unique_ptr<DataLoader>> eval = createArrayLoader(
      s->executable(),
      {{"images", dir.file("eval_images.npy")},
       {"labels", dir.file("eval_labels.npy")}},
      false);
  ASSERT_TRUE(train.isOk() && eval.isOk());
  TrainerOptions o = quietOptions(12);
  o.metricsPath = dir.file("m.jsonl");
  o.evalEvery = 5;
  o.checkpointDir = dir.file("ckpt");
  o.checkpointEvery = 5;
  Expected<std::unique_ptr<Trainer>> t = Trainer::create(*s, **train, &**eval, o);
  ASSERT_TRUE(t.isOk()) << t.status().message();

  // Evaluating changes nothing.
  ASSERT_TRUE(s->initializeParams().isOk());
  HostTensor w0 = *s->readArgument("W");
  Expected<EvalResult> e0 = (*t)->evaluate();
  ASSERT_TRUE(e0.isOk()) << e0.status().message();
  EXPECT_EQ(s->readArgument("W")->bytes, w0.bytes);
  EXPECT_EQ(s->readArgument("step")->elementAsDouble(0), 0);
  EXPECT_EQ(e0->batches, 1);
  ASSERT_TRUE(e0->accuracy.has_value());

  ASSERT_TRUE((*t)->run().isOk());
  std::ifstream in(o.metricsPath);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    ++n;
    EXPECT_EQ(j["step"], n);
    EXPECT_TRUE(j["loss"].is_number());
    EXPECT_EQ(j["lr"], 0.5);
    EXPECT_TRUE(j["grad_norm"].is_number());
    EXPECT_GT(j["samples_per_s"].get<double>(), 0);
    EXPECT_GT(j["step_time_s"].get<double>(), 0);
    EXPECT_FALSE(j.contains("tokens_per_s"));
    bool evaluated = n == 5 || n == 10 || n == 12; // and after the last
    EXPECT_EQ(j.contains("eval_loss"), evaluated) << line;
    EXPECT_EQ(j.contains("eval_accuracy"), evaluated) << line;
  }
  EXPECT_EQ(n, 12);
  const EvalResult &last = *(*t)->history().back().eval;
  EXPECT_LT(last.loss, e0->loss);
  EXPECT_GE(*last.accuracy, 0.75);
  EXPECT_TRUE(fs::exists(dir.file("ckpt/step-000005.safetensors")));
  EXPECT_TRUE(fs::exists(dir.file("ckpt/step-000010.safetensors")));
  EXPECT_TRUE(fs::exists(dir.file("ckpt/step-000012.safetensors"))); // at exit
  EXPECT_EQ((*t)->lastCheckpoint(), dir.file("ckpt/step-000012.safetensors"));
}

TEST(Trainer, RejectsPlansAndDataThatDoNotFit) {
  ExeBuilder b;
  int32_t x = b.input("x", tt({2}));
  b.output("loss", b.op("sum", {x}, tt({}), reduceAll(1)));
  auto inference = makeSession(b.build());
  Expected<std::unique_ptr<DataLoader>> l =
      createSyntheticLoader(inference->executable(), {"x"}, 0);
  EXPECT_EQ(Trainer::create(*inference, **l, nullptr, quietOptions(1))
                .status()
                .message(),
            "the plan is not a training step: no output updates a param or "
            "state (compile it with dlopt-compile --train)");
  auto s = makeSession(bigramModel(4, 1, 2));
  Expected<std::unique_ptr<DataLoader>> some =
      createSyntheticLoader(s->executable(), {"tokens"}, 0);
  EXPECT_EQ(Trainer::create(*s, **some, nullptr, quietOptions(1))
                .status()
                .message(),
            "input 'labels' is fed neither by the data (synthetic) nor bound");
}
