//===- Models.h - Model families and presets of dlopt-gen -------*- C++ -*-===//
//
// The architectures dlopt-gen can write (MLP, GPT-2/3, LLaMA-3, ResNet, a
// small CNN), their configuration and their named presets.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "tools/dlopt-gen/Emitter.h"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dlopt::gen {

enum class Family { MLP, GPT, LLaMA, ResNet, CNN };

const char *familyName(Family F);
std::optional<Family> parseFamily(std::string_view S);
/// All families, in the order they are documented.
const std::vector<Family> &allFamilies();
/// The preset used when a family is given without --preset.
const char *defaultPreset(Family F);

/// Every knob of every family; a family reads only the ones it documents.
struct ModelConfig {
  Family Fam = Family::GPT;
  std::string Preset;
  // Transformers (gpt, llama) and mlp.
  int64_t Layers = 0;  ///< Blocks (gpt, llama), hidden layers (mlp).
  int64_t Hidden = 0;  ///< Model width.
  int64_t Heads = 0;   ///< Attention (query) heads.
  int64_t KVHeads = 0; ///< Key/value heads (llama).
  int64_t FFN = 0;     ///< MLP inner width.
  int64_t Seq = 0;     ///< Sequence length.
  int64_t Vocab = 0;   ///< Vocabulary size.
  int64_t Batch = 1;
  bool Tied = true;           ///< LM head shares the token embedding.
  double Dropout = 0.0;       ///< 0: no dropout ops.
  int64_t Seed = 42;          ///< Seed of the first dropout op.
  double RopeTheta = 10000.0; ///< llama.
  double NormEps = 1e-5;      ///< LayerNorm / RMSNorm epsilon.
  // mlp.
  int64_t In = 0; ///< Input features.
  std::string Activation = "relu";
  // mlp, resnet, cnn.
  int64_t Classes = 0;
  // resnet, cnn.
  int64_t ImageSize = 0;
  int64_t Channels = 3;             ///< Input image channels.
  int64_t Width = 64;               ///< Channels of the first stage.
  std::vector<int64_t> StageDepths; ///< resnet blocks per stage.
  bool Bottleneck = false;          ///< resnet50+ blocks.
  ElemType DType = ElemType::F32;   ///< Params and float activations.
};

struct Preset {
  const char *Name;
  const char *Description;
  ModelConfig Config;
};

/// All presets, grouped by family.
const std::vector<Preset> &presets();
const Preset *findPreset(std::string_view Name);

/// Checks the sizes of \p C; throws GenError with a user-facing message.
void validateConfig(const ModelConfig &C);

/// One-line description of the resolved dimensions, e.g.
/// "layers=2 hidden=64 heads=4 ...".
std::string describeConfig(const ModelConfig &C);

/// A generated model function and its statistics.
struct GeneratedModel {
  std::string Text;
  int64_t TrainableParams = 0;
  int64_t BufferParams = 0; ///< Running statistics (batch norm).
  int64_t ParamTensors = 0;
  int64_t Ops = 0;
};

/// Builds the model described by \p C (which must be valid). \p Header lines
/// are put at the top as comments; a "Parameters: ..." line is appended.
GeneratedModel generateModel(const ModelConfig &C,
                             std::vector<std::string> Header,
                             bool Generic = false);

} // namespace dlopt::gen
