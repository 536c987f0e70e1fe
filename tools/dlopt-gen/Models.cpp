//===- Models.cpp - Model families and presets of dlopt-gen ---------------===//
//
// Each build* function writes one architecture through a ModelEmitter. The
// naming and layout conventions are documented in docs/dlopt-gen.md; keep
// them in sync.
//
//===----------------------------------------------------------------------===//
#include "tools/dlopt-gen/Models.h"

#include <cmath>

namespace dlopt::gen {

//===----------------------------------------------------------------------===//
// Families and presets
//===----------------------------------------------------------------------===//

const char *familyName(Family F) {
  switch (F) {
  case Family::MLP:
    return "mlp";
  case Family::GPT:
    return "gpt";
  case Family::LLaMA:
    return "llama";
  case Family::ResNet:
    return "resnet";
  case Family::CNN:
    return "cnn";
  }
  return "?";
}

const std::vector<Family> &allFamilies() {
  static const std::vector<Family> All = {
      Family::MLP, Family::GPT, Family::LLaMA, Family::ResNet, Family::CNN};
  return All;
}

std::optional<Family> parseFamily(std::string_view S) {
  for (Family F : allFamilies())
    if (S == familyName(F))
      return F;
  return std::nullopt;
}

const char *defaultPreset(Family F) {
  switch (F) {
  case Family::MLP:
    return "mlp-small";
  case Family::GPT:
    return "gpt2-small";
  case Family::LLaMA:
    return "llama3-8b";
  case Family::ResNet:
    return "resnet50";
  case Family::CNN:
    return "cnn-small";
  }
  return "";
}

namespace {

ModelConfig mlp(int64_t In, int64_t Hidden, int64_t Layers, int64_t Classes,
                int64_t Batch) {
  ModelConfig C;
  C.Fam = Family::MLP;
  C.In = In;
  C.Hidden = Hidden;
  C.Layers = Layers;
  C.Classes = Classes;
  C.Batch = Batch;
  return C;
}

ModelConfig gpt(int64_t Layers, int64_t Hidden, int64_t Heads, int64_t Seq,
                int64_t Vocab, int64_t Batch) {
  ModelConfig C;
  C.Fam = Family::GPT;
  C.Layers = Layers;
  C.Hidden = Hidden;
  C.Heads = Heads;
  C.FFN = 4 * Hidden;
  C.Seq = Seq;
  C.Vocab = Vocab;
  C.Batch = Batch;
  C.Tied = true;
  return C;
}

ModelConfig llama(int64_t Layers, int64_t Hidden, int64_t Heads,
                  int64_t KVHeads, int64_t FFN, int64_t Seq, int64_t Vocab,
                  int64_t Batch, double Theta) {
  ModelConfig C;
  C.Fam = Family::LLaMA;
  C.Layers = Layers;
  C.Hidden = Hidden;
  C.Heads = Heads;
  C.KVHeads = KVHeads;
  C.FFN = FFN;
  C.Seq = Seq;
  C.Vocab = Vocab;
  C.Batch = Batch;
  C.Tied = false;
  C.RopeTheta = Theta;
  return C;
}

ModelConfig resnet(std::vector<int64_t> Depths, bool Bottleneck, int64_t Width,
                   int64_t Image, int64_t Classes, int64_t Batch) {
  ModelConfig C;
  C.Fam = Family::ResNet;
  C.StageDepths = std::move(Depths);
  C.Bottleneck = Bottleneck;
  C.Width = Width;
  C.ImageSize = Image;
  C.Channels = 3;
  C.Classes = Classes;
  C.Batch = Batch;
  return C;
}

ModelConfig cnn(int64_t Width, int64_t Image, int64_t Channels, int64_t Classes,
                int64_t Batch) {
  ModelConfig C;
  C.Fam = Family::CNN;
  C.Width = Width;
  C.ImageSize = Image;
  C.Channels = Channels;
  C.Classes = Classes;
  C.Batch = Batch;
  return C;
}

std::vector<Preset> makePresets() {
  std::vector<Preset> P = {
      {"mlp-tiny", "tiny MLP for tests", mlp(16, 32, 2, 4, 4)},
      {"mlp-small", "MNIST-sized MLP", mlp(784, 256, 2, 10, 32)},
      {"mlp-large", "wide 8-layer MLP", mlp(1024, 4096, 8, 1000, 64)},
      {"gpt-tiny", "tiny GPT for tests", gpt(2, 64, 4, 16, 128, 2)},
      {"gpt2-small", "GPT-2 124M", gpt(12, 768, 12, 1024, 50257, 1)},
      {"gpt2-medium", "GPT-2 350M", gpt(24, 1024, 16, 1024, 50257, 1)},
      {"gpt2-large", "GPT-2 774M", gpt(36, 1280, 20, 1024, 50257, 1)},
      {"gpt2-xl", "GPT-2 1.5B", gpt(48, 1600, 25, 1024, 50257, 1)},
      {"gpt3-1.3b", "GPT-3 XL", gpt(24, 2048, 16, 2048, 50257, 1)},
      {"gpt3-2.7b", "GPT-3 2.7B", gpt(32, 2560, 32, 2048, 50257, 1)},
      {"gpt3-6.7b", "GPT-3 6.7B", gpt(32, 4096, 32, 2048, 50257, 1)},
      // The GPT-3 paper lists d_model 5140 for 13B, but 40 heads x 128 =
      // 5120, the width used in practice.
      {"gpt3-13b", "GPT-3 13B", gpt(40, 5120, 40, 2048, 50257, 1)},
      {"gpt3-175b", "GPT-3 175B", gpt(96, 12288, 96, 2048, 50257, 1)},
      {"llama-tiny", "tiny LLaMA for tests",
       llama(2, 64, 4, 2, 192, 16, 128, 2, 10000.0)},
      {"llama3-8b", "Llama 3 8B",
       llama(32, 4096, 32, 8, 14336, 8192, 128256, 1, 500000.0)},
      {"llama3-70b", "Llama 3 70B",
       llama(80, 8192, 64, 8, 28672, 8192, 128256, 1, 500000.0)},
      {"llama3-405b", "Llama 3.1 405B",
       llama(126, 16384, 128, 8, 53248, 8192, 128256, 1, 500000.0)},
      {"resnet-tiny", "tiny ResNet for tests",
       resnet({1, 1, 1, 1}, false, 8, 32, 10, 2)},
      {"resnet18", "ResNet-18", resnet({2, 2, 2, 2}, false, 64, 224, 1000, 1)},
      {"resnet34", "ResNet-34", resnet({3, 4, 6, 3}, false, 64, 224, 1000, 1)},
      {"resnet50", "ResNet-50 (v1.5)",
       resnet({3, 4, 6, 3}, true, 64, 224, 1000, 1)},
      {"resnet101", "ResNet-101 (v1.5)",
       resnet({3, 4, 23, 3}, true, 64, 224, 1000, 1)},
      {"resnet152", "ResNet-152 (v1.5)",
       resnet({3, 8, 36, 3}, true, 64, 224, 1000, 1)},
      {"cnn-small", "2-conv CNN for 28x28 images", cnn(16, 28, 1, 10, 4)},
  };
  for (Preset &Pr : P)
    Pr.Config.Preset = Pr.Name;
  return P;
}

} // namespace

const std::vector<Preset> &presets() {
  static const std::vector<Preset> All = makePresets();
  return All;
}

const Preset *findPreset(std::string_view Name) {
  for (const Preset &P : presets())
    if (Name == P.Name)
      return &P;
  return nullptr;
}

//===----------------------------------------------------------------------===//
// Validation and description
//===----------------------------------------------------------------------===//

namespace {

void requirePositive(const char *Opt, int64_t V) {
  if (V <= 0)
    throw GenError(std::string(Opt) + " must be positive (got " +
                   std::to_string(V) + ")");
}

/// Sizes above this are rejected so no element count can overflow int64.
constexpr int64_t MaxDim = int64_t(1) << 24;
/// Keeps the output size sane (real models have at most a few hundred).
constexpr int64_t MaxLayers = 10000;

void requireDim(const char *Opt, int64_t V) {
  requirePositive(Opt, V);
  if (V > MaxDim)
    throw GenError(std::string(Opt) + " is too large (got " +
                   std::to_string(V) + ", at most " + std::to_string(MaxDim) +
                   ")");
}

} // namespace

void validateConfig(const ModelConfig &C) {
  requireDim("--batch", C.Batch);
  if (C.Layers > MaxLayers)
    throw GenError("--layers is too large (got " + std::to_string(C.Layers) +
                   ", at most " + std::to_string(MaxLayers) + ")");
  if (C.Dropout < 0.0 || !(C.Dropout < 1.0))
    throw GenError("--dropout must be in [0, 1) (got " +
                   formatFloat(C.Dropout) + ")");
  switch (C.Fam) {
  case Family::MLP:
    requireDim("--layers", C.Layers);
    requireDim("--hidden", C.Hidden);
    requireDim("--in", C.In);
    requireDim("--classes", C.Classes);
    if (C.Activation != "relu" && C.Activation != "gelu" &&
        C.Activation != "silu")
      throw GenError("unknown --activation '" + C.Activation +
                     "' (expected relu, gelu or silu)");
    return;
  case Family::GPT:
  case Family::LLaMA: {
    requireDim("--layers", C.Layers);
    requireDim("--hidden", C.Hidden);
    requireDim("--heads", C.Heads);
    requireDim("--ffn", C.FFN);
    requireDim("--seq", C.Seq);
    requireDim("--vocab", C.Vocab);
    if (C.Hidden % C.Heads != 0)
      throw GenError("--hidden (" + std::to_string(C.Hidden) +
                     ") must be divisible by --heads (" +
                     std::to_string(C.Heads) + ")");
    if (C.Fam == Family::GPT)
      return;
    requireDim("--kv-heads", C.KVHeads);
    if (C.Heads % C.KVHeads != 0)
      throw GenError("--kv-heads (" + std::to_string(C.KVHeads) +
                     ") must divide --heads (" + std::to_string(C.Heads) + ")");
    if ((C.Hidden / C.Heads) % 2 != 0)
      throw GenError("head dim --hidden/--heads (" +
                     std::to_string(C.Hidden / C.Heads) +
                     ") must be even for rotary embeddings");
    if (!(C.RopeTheta > 0.0) || !std::isfinite(C.RopeTheta))
      throw GenError("--rope-theta must be positive");
    return;
  }
  case Family::ResNet:
  case Family::CNN:
    requireDim("--image-size", C.ImageSize);
    requireDim("--channels", C.Channels);
    requireDim("--width", C.Width);
    requireDim("--classes", C.Classes);
    if (C.Fam == Family::CNN && C.ImageSize < 4)
      throw GenError("--image-size must be at least 4 for cnn (got " +
                     std::to_string(C.ImageSize) + ")");
    if (C.Fam == Family::ResNet && C.Width > MaxDim / 32)
      throw GenError("--width is too large");
    return;
  }
}

std::string describeConfig(const ModelConfig &C) {
  auto I = [](int64_t V) { return std::to_string(V); };
  std::string D;
  switch (C.Fam) {
  case Family::MLP:
    D = "in=" + I(C.In) + " hidden=" + I(C.Hidden) + " layers=" + I(C.Layers) +
        " classes=" + I(C.Classes) + " activation=" + C.Activation;
    break;
  case Family::GPT:
  case Family::LLaMA:
    D = "layers=" + I(C.Layers) + " hidden=" + I(C.Hidden) +
        " heads=" + I(C.Heads);
    if (C.Fam == Family::LLaMA)
      D += " kv-heads=" + I(C.KVHeads);
    D += " head-dim=" + I(C.Hidden / C.Heads) + " ffn=" + I(C.FFN) +
         " seq=" + I(C.Seq) + " vocab=" + I(C.Vocab) +
         (C.Tied ? " tied" : " untied");
    if (C.Fam == Family::LLaMA)
      D += " rope-theta=" + formatFloat(C.RopeTheta);
    break;
  case Family::ResNet: {
    std::string Depths;
    for (int64_t N : C.StageDepths)
      Depths += (Depths.empty() ? "" : ",") + I(N);
    D = "blocks=" + Depths + (C.Bottleneck ? " bottleneck" : " basic") +
        " width=" + I(C.Width) + " image=" + I(C.Channels) + "x" +
        I(C.ImageSize) + "x" + I(C.ImageSize) + " classes=" + I(C.Classes);
    break;
  }
  case Family::CNN:
    D = "width=" + I(C.Width) + " image=" + I(C.Channels) + "x" +
        I(C.ImageSize) + "x" + I(C.ImageSize) + " classes=" + I(C.Classes);
    break;
  }
  D += " batch=" + I(C.Batch) + " dtype=" + elemTypeName(C.DType);
  if (C.Dropout > 0.0)
    D += " dropout=" + formatFloat(C.Dropout) + " seed=" + I(C.Seed);
  return D;
}

//===----------------------------------------------------------------------===//
// Builders
//===----------------------------------------------------------------------===//

namespace {

constexpr ElemType I32 = ElemType::I32;

std::string str(int64_t V) { return std::to_string(V); }

/// Casts the logits to f32 (if needed) and appends the cross-entropy loss as
/// the first output, then (for classifiers, so dlopt-run can report
/// accuracy) the logits. Runs with no layer mark.
void emitLoss(ModelEmitter &E, Value Logits, const Value &Labels,
              bool WithLogits = false) {
  E.setLayer(-1);
  if (Logits.Type.Elem != ElemType::F32)
    Logits = E.cast(Logits, ElemType::F32, "logits_f32");
  E.addOutput("loss", E.crossEntropy(Logits, Labels, "loss"));
  if (WithLogits)
    E.addOutput("logits", Logits);
}

/// Emits `x W + b` with torch.nn.Linear's default init; \p P names the
/// params (P.weight [In, Out], P.bias [Out]).
Value linear(ModelEmitter &E, const Value &X, const std::string &P, int64_t Out,
             std::string_view Name) {
  int64_t In = X.Type.Shape.back();
  double Bound = 1.0 / std::sqrt(static_cast<double>(In));
  ElemType DT = X.Type.Elem;
  Value W =
      E.addParam(P + ".weight", {{In, Out}, DT}, Init::uniform(-Bound, Bound));
  Value B = E.addParam(P + ".bias", {{Out}, DT}, Init::uniform(-Bound, Bound));
  Value Y = E.matmul(X, W, std::string(Name) + "_mm");
  return E.binary("add", Y, B, Name);
}

void buildMLP(ModelEmitter &E, const ModelConfig &C) {
  Value X = E.addInput("x", {{C.Batch, C.In}, C.DType});
  Value Labels = E.addInput("labels", {{C.Batch}, I32});
  int64_t Seed = C.Seed;
  for (int64_t L = 0; L < C.Layers; ++L) {
    E.setLayer(L);
    std::string N = "fc" + str(L);
    X = linear(E, X, N, C.Hidden, N);
    X = E.unary(C.Activation, X, N + "_act");
    if (C.Dropout > 0.0)
      X = E.dropout(X, C.Dropout, Seed++, N + "_drop");
  }
  E.setLayer(-1);
  Value Logits = linear(E, X, "head", C.Classes, "logits");
  emitLoss(E, Logits, Labels, /*WithLogits=*/true);
}

/// GPT-2/3 and LLaMA share the skeleton; the differences are switched on
/// the family.
void buildTransformer(ModelEmitter &E, const ModelConfig &C) {
  const bool IsLLaMA = C.Fam == Family::LLaMA;
  const ElemType DT = C.DType;
  const int64_t B = C.Batch, S = C.Seq, H = C.Hidden, NH = C.Heads, Dh = H / NH,
                V = C.Vocab, F = C.FFN;
  const int64_t KVH = IsLLaMA ? C.KVHeads : NH;
  const double Std = 0.02;
  const double ResStd = 0.02 / std::sqrt(2.0 * static_cast<double>(C.Layers));
  int64_t Seed = C.Seed;

  Value Tokens = E.addInput("tokens", {{B, S}, I32});
  Value Labels = E.addInput("labels", {{B, S}, I32});
  Value Wte = E.addParam("wte", {{V, H}, DT}, Init::normal(Std));
  Value X = E.gather(Wte, Tokens, IsLLaMA ? "emb" : "tok_emb");
  if (!IsLLaMA) {
    Value Wpe = E.addParam("wpe", {{S, H}, DT}, Init::normal(Std));
    Value Pos = E.iota({S}, 0, I32, "pos");
    Value PosEmb = E.gather(Wpe, Pos, "pos_emb");
    X = E.binary("add", X, PosEmb, "emb");
  }
  if (C.Dropout > 0.0)
    X = E.dropout(X, C.Dropout, Seed++, "emb_drop");

  auto Norm = [&](const Value &In, const std::string &P,
                  const std::string &Name) {
    Value W = E.addParam(P + ".weight", {{H}, DT}, Init::ones());
    if (IsLLaMA)
      return E.rmsNorm(In, &W, 2, C.NormEps, Name);
    Value Bi = E.addParam(P + ".bias", {{H}, DT}, Init::zeros());
    return E.layerNorm(In, &W, &Bi, 2, C.NormEps, Name);
  };
  /// `x W (+ b)`; the weight is P.w<Which>, the bias P.b<Which> (gpt only).
  auto Proj = [&](const Value &In, const std::string &P,
                  const std::string &Which, int64_t Out, double InitStd,
                  const std::string &Name) {
    Value W = E.addParam(P + "w" + Which, {{In.Type.Shape.back(), Out}, DT},
                         Init::normal(InitStd));
    if (IsLLaMA)
      return E.matmul(In, W, Name);
    Value Bi = E.addParam(P + "b" + Which, {{Out}, DT}, Init::zeros());
    Value Y = E.matmul(In, W, Name + "_mm");
    return E.binary("add", Y, Bi, Name);
  };

  for (int64_t L = 0; L < C.Layers; ++L) {
    E.setLayer(L);
    const std::string P = "h" + str(L) + ".";
    const std::string N = "h" + str(L) + "_";

    // Attention.
    Value A = Norm(X, P + "ln1", N + "ln1");
    auto Heads = [&](const std::string &Which, int64_t Count, bool Rope) {
      Value Y = Proj(A, P + "attn.", Which, Count * Dh, Std, N + Which);
      Y = E.reshape(Y, {B, S, Count, Dh}, N + Which + "_4d");
      Y = E.transpose(Y, {0, 2, 1, 3}, N + Which + "_bhsd");
      if (Rope)
        Y = E.rope(Y, C.RopeTheta, N + Which + "_rope");
      return Y;
    };
    Value Q = Heads("q", NH, IsLLaMA);
    Value K = Heads("k", KVH, IsLLaMA);
    Value Vv = Heads("v", KVH, false);
    Value O = E.attention(Q, K, Vv, /*Causal=*/true,
                          1.0 / std::sqrt(static_cast<double>(Dh)), N + "attn");
    O = E.transpose(O, {0, 2, 1, 3}, N + "attn_bshd");
    O = E.reshape(O, {B, S, NH * Dh}, N + "attn_merged");
    O = Proj(O, P + "attn.", "o", H, ResStd, N + "attn_out");
    if (C.Dropout > 0.0)
      O = E.dropout(O, C.Dropout, Seed++, N + "attn_drop");
    X = E.binary("add", X, O, N + "res1");

    // MLP.
    Value M = Norm(X, P + "ln2", N + "ln2");
    if (IsLLaMA) {
      Value Gate =
          E.addParam(P + "mlp.w_gate", {{H, F}, DT}, Init::normal(Std));
      Value Up = E.addParam(P + "mlp.w_up", {{H, F}, DT}, Init::normal(Std));
      Value Down =
          E.addParam(P + "mlp.w_down", {{F, H}, DT}, Init::normal(ResStd));
      Value G = E.matmul(M, Gate, N + "gate");
      G = E.unary("silu", G, N + "gate_silu");
      Value U = E.matmul(M, Up, N + "up");
      M = E.binary("mul", G, U, N + "swiglu");
      M = E.matmul(M, Down, N + "down");
    } else {
      M = Proj(M, P + "mlp.", "1", F, Std, N + "fc1");
      M = E.unary("gelu", M, N + "gelu", {"approximate = \"tanh\""});
      M = Proj(M, P + "mlp.", "2", H, ResStd, N + "fc2");
    }
    if (C.Dropout > 0.0)
      M = E.dropout(M, C.Dropout, Seed++, N + "mlp_drop");
    X = E.binary("add", X, M, N + "out");
  }

  E.setLayer(-1);
  X = Norm(X, "ln_f", "ln_f");
  Value Logits;
  if (C.Tied) {
    Logits = E.matmul(X, Wte, "logits", false, /*TransposeB=*/true);
  } else {
    Value Head = E.addParam("lm_head", {{H, V}, DT}, Init::normal(Std));
    Logits = E.matmul(X, Head, "logits");
  }
  Logits = E.reshape(Logits, {B * S, V}, "logits_2d");
  Value Flat = E.reshape(Labels, {B * S}, "labels_flat");
  emitLoss(E, Logits, Flat);
}

/// Shared by resnet and cnn: conv (no bias) + training batch norm, whose
/// new running statistics become outputs after the loss.
class ConvNetBuilder {
public:
  ConvNetBuilder(ModelEmitter &E, ElemType DT) : E(E), DT(DT) {}

  /// conv2d(P.weight) then batch_norm(BnP.*); \p Name prefixes SSA names.
  Value convBn(const Value &X, const std::string &ConvP, const std::string &BnP,
               int64_t Out, int64_t Kernel, int64_t Stride, int64_t Pad,
               const std::string &ConvName, const std::string &BnName) {
    int64_t In = X.Type.Shape[1];
    // Kaiming normal, fan_out, relu gain (torchvision's ResNet init).
    double Std = std::sqrt(2.0 / static_cast<double>(Out * Kernel * Kernel));
    Value W = E.addParam(ConvP + ".weight", {{Out, In, Kernel, Kernel}, DT},
                         Init::normal(Std));
    Value Y = E.conv2d(X, W, nullptr, {Stride, Stride}, {Pad, Pad}, ConvName);
    TensorType CT{{Out}, DT};
    Value G = E.addParam(BnP + ".weight", CT, Init::ones());
    Value Bi = E.addParam(BnP + ".bias", CT, Init::zeros());
    Value RM = E.addParam(BnP + ".running_mean", CT, Init::zeros(),
                          /*Trainable=*/false);
    Value RV = E.addParam(BnP + ".running_var", CT, Init::ones(),
                          /*Trainable=*/false);
    auto [Z, NewRM, NewRV] =
        E.batchNorm(Y, G, Bi, RM, RV, 1e-5, 0.1, /*Training=*/true, BnName);
    Stats.emplace_back(BnP + ".running_mean", NewRM);
    Stats.emplace_back(BnP + ".running_var", NewRV);
    return Z;
  }

  /// Global average pool, flatten, linear head, loss, running stats.
  void finish(Value X, const Value &Labels, int64_t Classes, bool Pool) {
    E.setLayer(-1);
    const std::vector<int64_t> S = X.Type.Shape;
    if (Pool)
      X = E.pool2d("avg_pool2d", X, {S[2], S[3]}, {S[2], S[3]}, {0, 0},
                   "avgpool");
    X = E.reshape(X, {S[0], X.Type.numElements() / S[0]}, "flat");
    Value Logits = linear(E, X, "fc", Classes, "logits");
    emitLoss(E, Logits, Labels, /*WithLogits=*/true);
    for (auto &[Name, V] : Stats)
      E.addOutput(Name, V, /*Updates=*/Name);
  }

  ModelEmitter &E;
  ElemType DT;
  std::vector<std::pair<std::string, Value>> Stats;
};

void buildResNet(ModelEmitter &E, const ModelConfig &C) {
  ConvNetBuilder CB(E, C.DType);
  Value X = E.addInput(
      "images", {{C.Batch, C.Channels, C.ImageSize, C.ImageSize}, C.DType});
  Value Labels = E.addInput("labels", {{C.Batch}, I32});

  // Stem.
  X = CB.convBn(X, "conv1", "bn1", C.Width, 7, 2, 3, "conv1", "bn1");
  X = E.unary("relu", X, "relu1");
  X = E.pool2d("max_pool2d", X, {3, 3}, {2, 2}, {1, 1}, "maxpool");

  const int64_t Expansion = C.Bottleneck ? 4 : 1;
  int64_t Block = 0;
  for (size_t Stage = 0; Stage < C.StageDepths.size(); ++Stage) {
    int64_t Planes = C.Width << Stage;
    for (int64_t I = 0; I < C.StageDepths[Stage]; ++I, ++Block) {
      E.setLayer(Block);
      int64_t Stride = (Stage > 0 && I == 0) ? 2 : 1;
      std::string P = "layer" + str(Stage + 1) + "." + str(I) + ".";
      std::string N = "layer" + str(Stage + 1) + "_" + str(I) + "_";
      int64_t InC = X.Type.Shape[1];
      Value Y = X;
      if (C.Bottleneck) {
        Y = CB.convBn(Y, P + "conv1", P + "bn1", Planes, 1, 1, 0, N + "conv1",
                      N + "bn1");
        Y = E.unary("relu", Y, N + "relu1");
        Y = CB.convBn(Y, P + "conv2", P + "bn2", Planes, 3, Stride, 1,
                      N + "conv2", N + "bn2");
        Y = E.unary("relu", Y, N + "relu2");
        Y = CB.convBn(Y, P + "conv3", P + "bn3", Planes * 4, 1, 1, 0,
                      N + "conv3", N + "bn3");
      } else {
        Y = CB.convBn(Y, P + "conv1", P + "bn1", Planes, 3, Stride, 1,
                      N + "conv1", N + "bn1");
        Y = E.unary("relu", Y, N + "relu1");
        Y = CB.convBn(Y, P + "conv2", P + "bn2", Planes, 3, 1, 1, N + "conv2",
                      N + "bn2");
      }
      Value Shortcut = X;
      if (Stride != 1 || InC != Planes * Expansion)
        Shortcut = CB.convBn(X, P + "downsample.0", P + "downsample.1",
                             Planes * Expansion, 1, Stride, 0, N + "down_conv",
                             N + "down_bn");
      Y = E.binary("add", Y, Shortcut, N + "add");
      X = E.unary("relu", Y, N + "out");
    }
  }
  CB.finish(X, Labels, C.Classes, /*Pool=*/true);
}

void buildCNN(ModelEmitter &E, const ModelConfig &C) {
  ConvNetBuilder CB(E, C.DType);
  Value X = E.addInput(
      "images", {{C.Batch, C.Channels, C.ImageSize, C.ImageSize}, C.DType});
  Value Labels = E.addInput("labels", {{C.Batch}, I32});
  for (int64_t L = 0; L < 2; ++L) {
    E.setLayer(L);
    std::string N = str(L + 1);
    X = CB.convBn(X, "conv" + N, "bn" + N, C.Width << L, 3, 1, 1, "conv" + N,
                  "bn" + N);
    X = E.unary("relu", X, "relu" + N);
    X = E.pool2d("max_pool2d", X, {2, 2}, {2, 2}, {0, 0}, "pool" + N);
  }
  CB.finish(X, Labels, C.Classes, /*Pool=*/false);
}

} // namespace

GeneratedModel generateModel(const ModelConfig &C,
                             std::vector<std::string> Header, bool Generic) {
  ModelEmitter E(Generic);
  switch (C.Fam) {
  case Family::MLP:
    buildMLP(E, C);
    break;
  case Family::GPT:
  case Family::LLaMA:
    buildTransformer(E, C);
    break;
  case Family::ResNet:
    buildResNet(E, C);
    break;
  case Family::CNN:
    buildCNN(E, C);
    break;
  }
  GeneratedModel M;
  M.TrainableParams = E.trainableParamElements();
  M.BufferParams = E.bufferParamElements();
  M.ParamTensors = E.numParamTensors();
  M.Ops = E.numOps();
  std::string Count = "Parameters: " + formatCount(M.TrainableParams) + " in " +
                      std::to_string(M.ParamTensors) + " tensors";
  if (M.BufferParams)
    Count += " (plus " + formatCount(M.BufferParams) +
             " batch-norm running-stat elements)";
  Header.push_back(Count);
  M.Text = E.finish(Header);
  return M;
}

} // namespace dlopt::gen
