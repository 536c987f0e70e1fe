//===- dlopt-gen.cpp - Write standard architectures as dlopt MLIR ---------===//
//
// dlopt-gen FAMILY [--preset NAME] [options] [-o FILE]
//
// Writes a training-step model function (`func.func @main`, loss first) in
// the dlopt dialect. See docs/dlopt-gen.md for families, presets, options
// and the IR conventions. Exit status: 0 ok, 1 invalid model or I/O error,
// 2 malformed command line.
//
//===----------------------------------------------------------------------===//
#include "tools/dlopt-gen/Models.h"

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <string_view>
#include <vector>

using namespace dlopt::gen;

namespace {

/// A malformed command line (exit status 2).
class UsageError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

enum FamilyMask : unsigned {
  FMLP = 1u << static_cast<unsigned>(Family::MLP),
  FGPT = 1u << static_cast<unsigned>(Family::GPT),
  FLLaMA = 1u << static_cast<unsigned>(Family::LLaMA),
  FResNet = 1u << static_cast<unsigned>(Family::ResNet),
  FCNN = 1u << static_cast<unsigned>(Family::CNN),
  FAll = FMLP | FGPT | FLLaMA | FResNet | FCNN,
};

/// A model option (tool options like -o are handled separately).
struct OptionInfo {
  const char *Name;    ///< Without the leading "--".
  const char *Metavar; ///< Empty for flags.
  unsigned Families;
  const char *Help;
};

const OptionInfo ModelOptions[] = {
    {"batch", "N", FAll, "batch size"},
    {"dtype", "T", FAll,
     "element type of params and float activations: f32 (default), bf16, "
     "f16"},
    {"layers", "N", FMLP | FGPT | FLLaMA,
     "transformer blocks (gpt, llama) or hidden layers (mlp)"},
    {"hidden", "N", FMLP | FGPT | FLLaMA, "model / hidden width"},
    {"heads", "N", FGPT | FLLaMA, "attention heads (must divide --hidden)"},
    {"kv-heads", "N", FLLaMA, "key/value heads (must divide --heads)"},
    {"ffn", "N", FGPT | FLLaMA,
     "MLP inner width (gpt: 4*hidden; llama: preset ratio to --hidden)"},
    {"seq", "N", FGPT | FLLaMA, "sequence length"},
    {"vocab", "N", FGPT | FLLaMA, "vocabulary size"},
    {"tied", "", FGPT | FLLaMA, "LM head reuses wte (gpt default)"},
    {"untied", "", FGPT | FLLaMA, "separate lm_head param (llama default)"},
    {"rope-theta", "X", FLLaMA, "rotary embedding base"},
    {"norm-eps", "X", FGPT | FLLaMA, "LayerNorm / RMSNorm epsilon (1e-5)"},
    {"dropout", "RATE", FMLP | FGPT, "dropout rate, 0 (default) = no dropout"},
    {"seed", "N", FMLP | FGPT, "seed of the first dropout op (42); +1 each"},
    {"in", "N", FMLP, "input features"},
    {"activation", "A", FMLP, "relu (default), gelu or silu"},
    {"classes", "N", FMLP | FResNet | FCNN, "number of classes"},
    {"image-size", "N", FResNet | FCNN, "image height and width"},
    {"channels", "N", FResNet | FCNN, "input image channels"},
    {"width", "N", FResNet | FCNN, "channels of the first stage"},
};

const OptionInfo *findOption(std::string_view Name) {
  for (const OptionInfo &O : ModelOptions)
    if (Name == O.Name)
      return &O;
  return nullptr;
}

std::string familyList(unsigned Mask) {
  std::string S;
  for (Family F : allFamilies())
    if (Mask & (1u << static_cast<unsigned>(F)))
      S += (S.empty() ? "" : ", ") + std::string(familyName(F));
  return S;
}

void printHelp() {
  std::string H =
      "usage: dlopt-gen FAMILY|PRESET [--preset NAME] [options] [-o FILE]\n"
      "\n"
      "Writes a standard architecture as a dlopt training-step function\n"
      "(func.func @main returning the loss first) in MLIR text.\n"
      "\n"
      "Families (default preset in parentheses):\n";
  for (Family F : allFamilies())
    H += "  " + std::string(familyName(F)) + " (" + defaultPreset(F) + ")\n";
  H += "\nPresets:\n";
  for (Family F : allFamilies()) {
    std::string Line = std::string("  ") + familyName(F) + ":";
    for (const Preset &P : presets())
      if (P.Config.Fam == F)
        Line += std::string(" ") + P.Name;
    H += Line + "\n";
  }
  H += "\nTool options:\n"
       "  -o, --output FILE  write to FILE (default: stdout)\n"
       "  --preset NAME      start from preset NAME (see --list-presets)\n"
       "  --list-presets     list presets with their dims and parameter "
       "counts\n"
       "  -q, --quiet        do not print the parameter count to stderr\n"
       "  --generic          print ops in MLIR's generic form (debugging)\n"
       "  -h, --help         show this help\n"
       "\nModel options (override the preset; --opt=VALUE also works):\n";
  for (const OptionInfo &O : ModelOptions) {
    std::string Lhs = std::string("  --") + O.Name;
    if (*O.Metavar)
      Lhs += std::string(" ") + O.Metavar;
    Lhs.resize(std::max<size_t>(Lhs.size() + 1, 21), ' ');
    H += Lhs + O.Help + " [" + familyList(O.Families) + "]\n";
  }
  H += "\nExit status: 0 ok, 1 invalid model or I/O error, 2 bad command "
       "line.\n";
  std::fputs(H.c_str(), stdout);
}

int64_t parseInt(const std::string &Opt, const std::string &V) {
  int64_t R = 0;
  const char *End = V.data() + V.size();
  auto [Ptr, Ec] = std::from_chars(V.data(), End, R);
  if (V.empty() || Ec != std::errc() || Ptr != End)
    throw UsageError("--" + Opt + " expects an integer, got '" + V + "'");
  return R;
}

double parseDouble(const std::string &Opt, const std::string &V) {
  errno = 0;
  char *End = nullptr;
  double R = std::strtod(V.c_str(), &End);
  if (V.empty() || End != V.c_str() + V.size() || errno == ERANGE ||
      !std::isfinite(R))
    throw UsageError("--" + Opt + " expects a number, got '" + V + "'");
  return R;
}

/// Applies one model option (already checked to exist) to \p C.
void applyOption(ModelConfig &C, const std::string &Name,
                 const std::string &V) {
  auto Int = [&] { return parseInt(Name, V); };
  if (Name == "batch")
    C.Batch = Int();
  else if (Name == "dtype") {
    auto T = parseFloatElemType(V);
    if (!T)
      throw GenError("unknown --dtype '" + V + "' (expected f32, bf16 or f16)");
    C.DType = *T;
  } else if (Name == "layers")
    C.Layers = Int();
  else if (Name == "hidden")
    C.Hidden = Int();
  else if (Name == "heads")
    C.Heads = Int();
  else if (Name == "kv-heads")
    C.KVHeads = Int();
  else if (Name == "ffn")
    C.FFN = Int();
  else if (Name == "seq")
    C.Seq = Int();
  else if (Name == "vocab")
    C.Vocab = Int();
  else if (Name == "tied")
    C.Tied = true;
  else if (Name == "untied")
    C.Tied = false;
  else if (Name == "rope-theta")
    C.RopeTheta = parseDouble(Name, V);
  else if (Name == "norm-eps") {
    C.NormEps = parseDouble(Name, V);
    if (!(C.NormEps >= 0.0))
      throw GenError("--norm-eps must not be negative");
  } else if (Name == "dropout")
    C.Dropout = parseDouble(Name, V);
  else if (Name == "seed")
    C.Seed = Int();
  else if (Name == "in")
    C.In = Int();
  else if (Name == "activation")
    C.Activation = V;
  else if (Name == "classes")
    C.Classes = Int();
  else if (Name == "image-size")
    C.ImageSize = Int();
  else if (Name == "channels")
    C.Channels = Int();
  else if (Name == "width")
    C.Width = Int();
}

/// Quotes \p S for the command line recorded in the header, if needed.
std::string shellQuote(const std::string &S) {
  bool Plain = !S.empty();
  for (char C : S)
    if (!(std::isalnum(static_cast<unsigned char>(C)) ||
          std::strchr("-_.,=/:+@%", C)))
      Plain = false;
  if (Plain)
    return S;
  std::string Q = "'";
  for (char C : S)
    Q += C == '\'' ? std::string("'\\''") : std::string(1, C);
  return Q + "'";
}

std::string paramSummary(const GeneratedModel &M) {
  double N = static_cast<double>(M.TrainableParams);
  char Short[32];
  if (N >= 1e9)
    std::snprintf(Short, sizeof(Short), "%.2fB", N / 1e9);
  else if (N >= 1e6)
    std::snprintf(Short, sizeof(Short), "%.1fM", N / 1e6);
  else
    std::snprintf(Short, sizeof(Short), "%.1fK", N / 1e3);
  return formatCount(M.TrainableParams) + " parameters (" + Short + ")";
}

void listPresets() {
  std::printf("%-12s %-7s %14s  %s\n", "PRESET", "FAMILY", "PARAMETERS",
              "DIMENSIONS");
  for (const Preset &P : presets()) {
    GeneratedModel M = generateModel(P.Config, {});
    std::printf("%-12s %-7s %14s  %s\n", P.Name, familyName(P.Config.Fam),
                formatCount(M.TrainableParams).c_str(),
                describeConfig(P.Config).c_str());
  }
}

int run(int Argc, char **Argv) {
  std::string OutFile;
  std::string PresetName;
  std::string Positional;
  bool Quiet = false, Generic = false;
  std::vector<std::pair<std::string, std::string>> Opts;
  std::vector<std::string> Recorded; // Command line for the header.

  for (int I = 1; I < Argc; ++I) {
    std::string A = Argv[I];
    auto TakeValue = [&](const std::string &Opt,
                         std::optional<std::string> Inline) -> std::string {
      if (Inline)
        return *Inline;
      if (I + 1 >= Argc)
        throw UsageError(Opt + " expects a value");
      return Argv[++I];
    };
    if (A == "-h" || A == "--help") {
      printHelp();
      return 0;
    }
    if (A == "--list-presets") {
      listPresets();
      return 0;
    }
    if (A == "-q" || A == "--quiet") {
      Quiet = true;
      continue;
    }
    if (A == "--generic") {
      Generic = true;
      Recorded.push_back(A);
      continue;
    }
    if (A == "-o" || A == "--output" || A.rfind("--output=", 0) == 0) {
      std::optional<std::string> Inline;
      if (A.size() > 8 && A[8] == '=')
        Inline = A.substr(9);
      OutFile = TakeValue("-o", Inline);
      if (OutFile.empty())
        throw UsageError("-o expects a file name");
      continue;
    }
    if (A.size() > 2 && A.rfind("-o", 0) == 0 && A[2] != '-') {
      OutFile = A.substr(2);
      continue;
    }
    if (A.rfind("--", 0) == 0) {
      std::string Name = A.substr(2);
      std::optional<std::string> Inline;
      if (size_t Eq = Name.find('='); Eq != std::string::npos) {
        Inline = Name.substr(Eq + 1);
        Name.resize(Eq);
      }
      if (Name == "preset") {
        PresetName = TakeValue("--preset", Inline);
        Recorded.push_back("--preset");
        Recorded.push_back(PresetName);
        continue;
      }
      const OptionInfo *O = findOption(Name);
      if (!O)
        throw UsageError("unknown option '" + A + "' (see dlopt-gen --help)");
      std::string V;
      if (*O->Metavar)
        V = TakeValue("--" + Name, Inline);
      else if (Inline)
        throw UsageError("--" + Name + " takes no value");
      Opts.emplace_back(Name, V);
      Recorded.push_back("--" + Name);
      if (*O->Metavar)
        Recorded.push_back(V);
      continue;
    }
    if (A.size() > 1 && A[0] == '-')
      throw UsageError("unknown option '" + A + "' (see dlopt-gen --help)");
    if (!Positional.empty())
      throw UsageError("unexpected argument '" + A + "' (family already '" +
                       Positional + "')");
    Positional = A;
    Recorded.insert(Recorded.begin(), A);
  }

  // Resolve the family and the preset.
  std::optional<Family> Fam;
  if (!Positional.empty()) {
    Fam = parseFamily(Positional);
    if (!Fam) {
      const Preset *P = findPreset(Positional);
      if (!P) {
        std::string Names;
        for (Family F : allFamilies())
          Names += (Names.empty() ? "" : ", ") + std::string(familyName(F));
        throw GenError("unknown family or preset '" + Positional +
                       "' (families: " + Names + "; see --list-presets)");
      }
      if (!PresetName.empty() && PresetName != Positional)
        throw UsageError("preset given twice ('" + Positional + "' and '" +
                         PresetName + "')");
      PresetName = Positional;
      Fam = P->Config.Fam;
    }
  }
  if (!Fam && PresetName.empty())
    throw UsageError("no family given (see dlopt-gen --help)");
  if (PresetName.empty())
    PresetName = defaultPreset(*Fam);
  const Preset *P = findPreset(PresetName);
  if (!P)
    throw GenError("unknown preset '" + PresetName +
                   "' (see dlopt-gen --list-presets)");
  if (Fam && P->Config.Fam != *Fam)
    throw GenError("preset '" + PresetName + "' belongs to family '" +
                   familyName(P->Config.Fam) + "', not '" + familyName(*Fam) +
                   "'");
  ModelConfig C = P->Config;

  // Apply overrides.
  bool HiddenSet = false, FFNSet = false;
  for (auto &[Name, V] : Opts) {
    const OptionInfo *O = findOption(Name);
    if (!(O->Families & (1u << static_cast<unsigned>(C.Fam))))
      throw UsageError("option --" + Name + " does not apply to family '" +
                       familyName(C.Fam) + "' (only " +
                       familyList(O->Families) + ")");
    applyOption(C, Name, V);
    HiddenSet |= Name == "hidden";
    FFNSet |= Name == "ffn";
  }
  if (!FFNSet && HiddenSet && C.Hidden > 0) {
    if (C.Fam == Family::GPT)
      C.FFN = 4 * C.Hidden;
    else if (C.Fam == Family::LLaMA) {
      // Keep the preset's ffn/hidden ratio, rounded up.
      __int128 Num = static_cast<__int128>(P->Config.FFN) * C.Hidden;
      C.FFN =
          static_cast<int64_t>((Num + P->Config.Hidden - 1) / P->Config.Hidden);
    }
  }
  if (!Opts.empty())
    C.Preset.clear();
  validateConfig(C);

  std::string Cmd = "dlopt-gen";
  for (const std::string &R : Recorded) {
    Cmd += ' ';
    Cmd += shellQuote(R);
  }
  std::string ModelLine = std::string("Model: ") + familyName(C.Fam) +
                          (Opts.empty() ? " preset " : " from preset ") +
                          PresetName + ": " + describeConfig(C);
  GeneratedModel M = generateModel(
      C, {"Generated by dlopt-gen; do not edit.", "Command: " + Cmd, ModelLine},
      Generic);

  if (OutFile.empty() || OutFile == "-") {
    if (std::fwrite(M.Text.data(), 1, M.Text.size(), stdout) != M.Text.size() ||
        std::fflush(stdout) != 0)
      throw GenError("cannot write to stdout");
  } else {
    std::FILE *F = std::fopen(OutFile.c_str(), "wb");
    if (!F)
      throw GenError("cannot open '" + OutFile +
                     "' for writing: " + std::strerror(errno));
    bool Ok = std::fwrite(M.Text.data(), 1, M.Text.size(), F) == M.Text.size();
    Ok &= std::fclose(F) == 0;
    if (!Ok)
      throw GenError("cannot write '" + OutFile + "'");
  }
  if (!Quiet) {
    std::string Msg = "dlopt-gen: " + std::string(familyName(C.Fam)) + " (" +
                      (Opts.empty() ? "" : "from ") + PresetName +
                      "): " + paramSummary(M) + " in " +
                      std::to_string(M.ParamTensors) + " tensors, " +
                      std::to_string(M.Ops) + " ops";
    if (M.BufferParams)
      Msg += ", plus " + formatCount(M.BufferParams) + " running-stat elements";
    std::fprintf(stderr, "%s\n", Msg.c_str());
  }
  return 0;
}

} // namespace

int main(int Argc, char **Argv) {
  try {
    return run(Argc, Argv);
  } catch (const UsageError &E) {
    std::fprintf(stderr, "dlopt-gen: error: %s\n", E.what());
    return 2;
  } catch (const GenError &E) {
    std::fprintf(stderr, "dlopt-gen: error: %s\n", E.what());
    return 1;
  } catch (const std::bad_alloc &) {
    std::fprintf(stderr, "dlopt-gen: error: out of memory\n");
    return 1;
  } catch (const std::exception &E) {
    std::fprintf(stderr, "dlopt-gen: error: %s\n", E.what());
    return 1;
  }
}
