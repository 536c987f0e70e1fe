//===- Emitter.h - Text emitter for dlopt model functions -------*- C++ -*-===//
//
// dlopt-gen writes MLIR as plain text (no MLIR libraries), so that even the
// largest presets generate in milliseconds and the tool builds everywhere.
// ModelEmitter collects the arguments, ops and results of one
// `func.func @main` model function and prints it in the `dlopt` dialect's
// custom syntax (docs/ops.md) or, for debugging, in MLIR's generic op form.
//
// Every op helper computes and checks its result type, so a generated
// function is well typed by construction; a failed check is an internal error
// (GenError) rather than silently wrong IR.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace dlopt::gen {

/// A user-facing error (bad option values, sizes out of range, ...).
class GenError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// Tensor element types of the dlopt dialect.
enum class ElemType { F32, F16, BF16, I32, I64, I1 };

/// MLIR spelling of \p T ("f32", "bf16", "i32", ...).
const char *elemTypeName(ElemType T);
/// Parses "f32", "f16" or "bf16"; std::nullopt otherwise.
std::optional<ElemType> parseFloatElemType(std::string_view S);

/// A statically shaped ranked tensor type; rank 0 is a scalar.
struct TensorType {
  std::vector<int64_t> Shape;
  ElemType Elem = ElemType::F32;

  int64_t rank() const { return static_cast<int64_t>(Shape.size()); }
  /// Element count; throws GenError on int64 overflow.
  int64_t numElements() const;
  /// Appends `tensor<2x16xf32>` to \p Out.
  void print(std::string &Out) const;
  std::string str() const;
  bool operator==(const TensorType &O) const = default;
};

/// An SSA value: its name (without '%') and type.
struct Value {
  std::string Name;
  TensorType Type;
};

/// Formats a double as an MLIR float literal that round-trips exactly and
/// always contains a '.', e.g. 0.02 -> "0.02", 1e-5 -> "1.0e-05".
std::string formatFloat(double V);
/// Formats an integer with thousands separators: 124439808 -> "124,439,808".
std::string formatCount(int64_t V);

/// A parameter initializer (`dlopt.init`).
struct Init {
  enum Kind { Zeros, Ones, Normal, Uniform } K = Zeros;
  double A = 0.0; ///< std (Normal) or low (Uniform).
  double B = 0.0; ///< high (Uniform).

  static Init zeros() { return {Zeros, 0, 0}; }
  static Init ones() { return {Ones, 0, 0}; }
  static Init normal(double Std) { return {Normal, Std, 0}; }
  static Init uniform(double Low, double High) { return {Uniform, Low, High}; }
  /// `{dist = "normal", std = 0.02 : f64}` etc.
  std::string str() const;
};

/// Builds the text of one model function.
class ModelEmitter {
public:
  /// \p Generic selects MLIR's generic op syntax instead of the custom one.
  explicit ModelEmitter(bool Generic = false) : Generic(Generic) {}

  //===--------------------------------------------------------------------===//
  // Function interface
  //===--------------------------------------------------------------------===//

  /// Adds a run-time input argument `{dlopt.input = "Name"}`.
  Value addInput(const std::string &Name, TensorType Type);
  /// Adds a parameter argument `{dlopt.param = "Name", dlopt.init = ...}`.
  /// With \p Trainable false it is training state instead
  /// (`{dlopt.state = "Name", dlopt.init = ...}`, e.g. batch-norm running
  /// statistics): saved and updated, never given a gradient.
  Value addParam(const std::string &Name, TensorType Type, Init I,
                 bool Trainable = true);
  /// Appends a function result named \p Name. The first one is the loss.
  /// A non-empty \p Updates marks it as the next value of that state
  /// (`dlopt.update`).
  void addOutput(const std::string &Name, const Value &V,
                 const std::string &Updates = "");

  /// Sets the `dlopt.layer` mark put on every following op; -1: no mark.
  void setLayer(int64_t Layer) { CurLayer = Layer; }
  int64_t layer() const { return CurLayer; }

  /// Prints the whole function; \p Header lines are emitted as `//` comments.
  std::string finish(const std::vector<std::string> &Header) const;

  int64_t trainableParamElements() const { return TrainableElems; }
  int64_t bufferParamElements() const { return BufferElems; }
  int64_t numParamTensors() const { return NumParams; }
  int64_t numOps() const { return NumOps; }

  //===--------------------------------------------------------------------===//
  // Ops. \p Name is the preferred SSA name of the result; it is made unique.
  //===--------------------------------------------------------------------===//

  /// Elementwise unary op (relu, gelu, silu, exp, ...). \p Attrs are extra
  /// dict entries, e.g. `approximate = "tanh"`.
  Value unary(std::string_view Op, const Value &X, std::string_view Name,
              std::vector<std::string> Attrs = {});
  /// Elementwise binary op with NumPy broadcasting (add, sub, mul, ...).
  Value binary(std::string_view Op, const Value &A, const Value &B,
               std::string_view Name);
  Value cast(const Value &X, ElemType To, std::string_view Name);
  Value matmul(const Value &A, const Value &B, std::string_view Name,
               bool TransposeA = false, bool TransposeB = false);
  Value reshape(const Value &X, std::vector<int64_t> Shape,
                std::string_view Name);
  Value transpose(const Value &X, const std::vector<int64_t> &Perm,
                  std::string_view Name);
  Value gather(const Value &Table, const Value &Ids, std::string_view Name);
  Value iota(std::vector<int64_t> Shape, int64_t Dim, ElemType Elem,
             std::string_view Name);
  Value layerNorm(const Value &X, const Value *W, const Value *B, int64_t Axis,
                  double Eps, std::string_view Name);
  Value rmsNorm(const Value &X, const Value *W, int64_t Axis, double Eps,
                std::string_view Name);
  Value attention(const Value &Q, const Value &K, const Value &V, bool Causal,
                  double Scale, std::string_view Name);
  Value rope(const Value &X, double Theta, std::string_view Name);
  Value conv2d(const Value &X, const Value &W, const Value *B,
               std::array<int64_t, 2> Stride, std::array<int64_t, 2> Padding,
               std::string_view Name);
  /// \p Op is "max_pool2d" or "avg_pool2d".
  Value pool2d(std::string_view Op, const Value &X,
               std::array<int64_t, 2> Kernel, std::array<int64_t, 2> Stride,
               std::array<int64_t, 2> Padding, std::string_view Name);
  /// Returns {y, new running mean, new running var}.
  std::array<Value, 3> batchNorm(const Value &X, const Value &W, const Value &B,
                                 const Value &Mean, const Value &Var,
                                 double Eps, double Momentum, bool Training,
                                 std::string_view Name);
  Value dropout(const Value &X, double Rate, int64_t Seed,
                std::string_view Name);
  Value crossEntropy(const Value &Logits, const Value &Labels,
                     std::string_view Name);

private:
  /// How the custom syntax prints the trailing types.
  enum class TypeStyle {
    Same,      ///< `: t` (result type = first operand's, or iota's result)
    Arrow,     ///< `: tA, tB -> tR`
    Functional ///< `: (tA, tB) -> tR` / `-> (tR1, tR2)`
  };
  /// A keyword attribute printed between the operands and the attr dict in
  /// the custom syntax (`perm = [1, 0]`, `dim = 0`).
  struct Keyword {
    std::string Name;
    std::vector<int64_t> Values;
    bool IsArray = true;
  };
  /// An operand printed as `Prefix(%v)` in the custom syntax when Prefix is
  /// non-empty (`weight(%w)`, `bias(%b)`).
  struct Operand {
    const Value *V;
    std::string Prefix;
  };
  struct OpSpec {
    std::string_view Op;
    std::vector<Operand> Operands;
    std::vector<Keyword> Keywords;
    std::vector<std::string> Attrs;
    TypeStyle Style = TypeStyle::Arrow;
    std::vector<TensorType> Results;
    /// Generic form only: `operandSegmentSizes` for ops whose ODS has several
    /// optional operands (layer_norm); empty: none.
    std::vector<int64_t> Segments = {};
  };

  /// Prints \p Spec with results named after \p Names; returns the results.
  std::vector<Value> emit(const OpSpec &Spec,
                          const std::vector<std::string_view> &Names);
  /// A fresh SSA name derived from \p Base ('.' and other odd characters
  /// become '_'; a numeric suffix is added on collision).
  std::string freshName(std::string_view Base);

  bool Generic;
  int64_t CurLayer = -1;
  std::string Args; ///< Argument list text, one argument per line.
  std::string Body; ///< Op lines.
  struct Output {
    std::string Name;
    Value V;
    std::string Updates;
  };
  std::vector<Output> Outputs;
  std::unordered_set<std::string> UsedNames;
  std::unordered_map<std::string, int64_t> NextSuffix;
  int64_t TrainableElems = 0;
  int64_t BufferElems = 0;
  int64_t NumParams = 0;
  int64_t NumOps = 0;
};

} // namespace dlopt::gen
