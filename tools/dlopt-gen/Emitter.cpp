//===- Emitter.cpp - Text emitter for dlopt model functions ---------------===//
//
// Prints ops in the custom syntax of docs/ops.md (or MLIR's generic form)
// and checks every result type on the way.
//
//===----------------------------------------------------------------------===//
#include "tools/dlopt-gen/Emitter.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>

namespace dlopt::gen {

namespace {

/// Throws an internal error: the generator built an ill-typed op.
[[noreturn]] void internalError(std::string_view Op, const std::string &Msg) {
  throw std::logic_error("internal error: dlopt." + std::string(Op) + ": " +
                         Msg);
}

std::string shapeStr(const std::vector<int64_t> &Shape) {
  std::string S = "[";
  for (size_t I = 0; I < Shape.size(); ++I)
    S += (I ? ", " : "") + std::to_string(Shape[I]);
  return S + "]";
}

bool isFloat(ElemType T) {
  return T == ElemType::F32 || T == ElemType::F16 || T == ElemType::BF16;
}
bool isInt(ElemType T) { return T == ElemType::I32 || T == ElemType::I64; }

/// NumPy broadcasting of two shapes; std::nullopt if incompatible.
std::optional<std::vector<int64_t>>
broadcastShapes(const std::vector<int64_t> &A, const std::vector<int64_t> &B) {
  size_t R = std::max(A.size(), B.size());
  std::vector<int64_t> Out(R);
  for (size_t I = 0; I < R; ++I) {
    int64_t DA = I < R - A.size() ? 1 : A[I - (R - A.size())];
    int64_t DB = I < R - B.size() ? 1 : B[I - (R - B.size())];
    if (DA != DB && DA != 1 && DB != 1)
      return std::nullopt;
    Out[I] = DA == 1 ? DB : DA;
  }
  return Out;
}

/// `array<i64: 1, 2>`.
std::string denseArray(const std::vector<int64_t> &V) {
  std::string S = "array<i64";
  for (size_t I = 0; I < V.size(); ++I)
    S += (I ? ", " : ": ") + std::to_string(V[I]);
  return S + ">";
}

std::string f64Attr(std::string_view Name, double V) {
  return std::string(Name) + " = " + formatFloat(V) + " : f64";
}
std::string i64Attr(std::string_view Name, int64_t V) {
  return std::string(Name) + " = " + std::to_string(V) + " : i64";
}

/// Output size of a convolution/pooling window along one dim.
int64_t windowOut(std::string_view Op, int64_t In, int64_t K, int64_t S,
                  int64_t P) {
  int64_t Span = In + 2 * P - K;
  if (Span < 0 || S < 1)
    internalError(Op, "window " + std::to_string(K) + " does not fit input " +
                          std::to_string(In) + " with padding " +
                          std::to_string(P));
  return Span / S + 1;
}

} // namespace

//===----------------------------------------------------------------------===//
// Types and literals
//===----------------------------------------------------------------------===//

const char *elemTypeName(ElemType T) {
  switch (T) {
  case ElemType::F32:
    return "f32";
  case ElemType::F16:
    return "f16";
  case ElemType::BF16:
    return "bf16";
  case ElemType::I32:
    return "i32";
  case ElemType::I64:
    return "i64";
  case ElemType::I1:
    return "i1";
  }
  return "?";
}

std::optional<ElemType> parseFloatElemType(std::string_view S) {
  if (S == "f32")
    return ElemType::F32;
  if (S == "f16")
    return ElemType::F16;
  if (S == "bf16")
    return ElemType::BF16;
  return std::nullopt;
}

int64_t TensorType::numElements() const {
  int64_t N = 1;
  for (int64_t D : Shape)
    if (__builtin_mul_overflow(N, D, &N))
      throw GenError("tensor of shape " + shapeStr(Shape) +
                     " has too many elements");
  return N;
}

void TensorType::print(std::string &Out) const {
  Out += "tensor<";
  char Buf[24];
  for (int64_t D : Shape) {
    auto R = std::to_chars(Buf, Buf + sizeof(Buf), D);
    Out.append(Buf, R.ptr);
    Out += 'x';
  }
  Out += elemTypeName(Elem);
  Out += '>';
}

std::string TensorType::str() const {
  std::string S;
  print(S);
  return S;
}

std::string formatFloat(double V) {
  char Buf[64];
  auto R = std::to_chars(Buf, Buf + sizeof(Buf), V);
  std::string S(Buf, R.ptr);
  // MLIR's lexer only takes a number as a float when it has a '.'.
  if (S.find('.') == std::string::npos) {
    size_t E = S.find_first_of("eE");
    if (E == std::string::npos)
      S += ".0";
    else
      S.insert(E, ".0");
  }
  return S;
}

std::string formatCount(int64_t V) {
  std::string Digits = std::to_string(V < 0 ? -V : V);
  std::string Out;
  for (size_t I = 0; I < Digits.size(); ++I) {
    if (I && (Digits.size() - I) % 3 == 0)
      Out += ',';
    Out += Digits[I];
  }
  return V < 0 ? "-" + Out : Out;
}

std::string Init::str() const {
  switch (K) {
  case Zeros:
    return "{dist = \"zeros\"}";
  case Ones:
    return "{dist = \"ones\"}";
  case Normal:
    return "{dist = \"normal\", " + f64Attr("std", A) + "}";
  case Uniform:
    return "{dist = \"uniform\", " + f64Attr("low", A) + ", " +
           f64Attr("high", B) + "}";
  }
  return "{}";
}

//===----------------------------------------------------------------------===//
// Function interface
//===----------------------------------------------------------------------===//

std::string ModelEmitter::freshName(std::string_view Base) {
  std::string S;
  S.reserve(Base.size() + 1);
  for (char C : Base)
    S += (std::isalnum(static_cast<unsigned char>(C)) || C == '_') ? C : '_';
  if (S.empty() || std::isdigit(static_cast<unsigned char>(S[0])))
    S.insert(0, "v");
  if (UsedNames.insert(S).second)
    return S;
  int64_t &Next = NextSuffix[S];
  for (;;) {
    std::string Cand = S + "_" + std::to_string(++Next);
    if (UsedNames.insert(Cand).second)
      return Cand;
  }
}

Value ModelEmitter::addInput(const std::string &Name, TensorType Type) {
  Type.numElements(); // Overflow check.
  Value V{freshName(Name), std::move(Type)};
  Args +=
      "%" + V.Name + ": " + V.Type.str() + " {dlopt.input = \"" + Name + "\"}";
  Args += ",\n";
  return V;
}

Value ModelEmitter::addParam(const std::string &Name, TensorType Type, Init I,
                             bool Trainable) {
  int64_t N = Type.numElements();
  int64_t &Acc = Trainable ? TrainableElems : BufferElems;
  if (__builtin_add_overflow(Acc, N, &Acc))
    throw GenError("too many parameters");
  ++NumParams;
  Value V{freshName(Name), std::move(Type)};
  Args += "%" + V.Name + ": " + V.Type.str() +
          (Trainable ? " {dlopt.param = \"" : " {dlopt.state = \"") + Name +
          "\", dlopt.init = " + I.str() + "}";
  Args += ",\n";
  return V;
}

void ModelEmitter::addOutput(const std::string &Name, const Value &V,
                            const std::string &Updates) {
  Outputs.push_back({Name, V, Updates});
}

std::string ModelEmitter::finish(const std::vector<std::string> &Header) const {
  std::string Out;
  Out.reserve(Args.size() + Body.size() + 4096);
  for (const std::string &L : Header)
    Out += "// " + L + "\n";
  // One argument per line, aligned after "func.func @main(".
  static constexpr std::string_view Open = "func.func @main(";
  std::string Indent(Open.size(), ' ');
  Out += Open;
  std::string_view A = Args;
  if (A.size() >= 2)
    A.remove_suffix(2); // Trailing ",\n".
  size_t Pos = 0;
  bool First = true;
  while (Pos <= A.size() && !A.empty()) {
    size_t End = A.find('\n', Pos);
    if (End == std::string_view::npos)
      End = A.size();
    if (!First)
      Out += Indent;
    Out.append(A.substr(Pos, End - Pos));
    First = false;
    if (End == A.size())
      break;
    Out += '\n';
    Pos = End + 1;
  }
  Out += ")\n    -> (";
  for (size_t I = 0; I < Outputs.size(); ++I) {
    if (I)
      Out += ",\n        ";
    Outputs[I].V.Type.print(Out);
    Out += " {dlopt.output = \"" + Outputs[I].Name + "\"";
    if (!Outputs[I].Updates.empty())
      Out += ", dlopt.update = \"" + Outputs[I].Updates + "\"";
    Out += "}";
  }
  Out += ") attributes {dlopt.loss} {\n";
  Out += Body;
  Out += "  return ";
  for (size_t I = 0; I < Outputs.size(); ++I)
    Out += (I ? ", %" : "%") + Outputs[I].V.Name;
  Out += " : ";
  for (size_t I = 0; I < Outputs.size(); ++I) {
    if (I)
      Out += ", ";
    Outputs[I].V.Type.print(Out);
  }
  Out += "\n}\n";
  return Out;
}

//===----------------------------------------------------------------------===//
// Op printing
//===----------------------------------------------------------------------===//

std::vector<Value>
ModelEmitter::emit(const OpSpec &Spec,
                   const std::vector<std::string_view> &Names) {
  ++NumOps;
  std::vector<Value> Results;
  for (size_t I = 0; I < Spec.Results.size(); ++I) {
    Spec.Results[I].numElements(); // Overflow check.
    Results.push_back({freshName(Names[I]), Spec.Results[I]});
  }
  std::vector<std::string> Attrs = Spec.Attrs;
  if (CurLayer >= 0)
    Attrs.push_back(i64Attr("dlopt.layer", CurLayer));

  std::string &O = Body;
  O += "  ";
  for (size_t I = 0; I < Results.size(); ++I)
    O += (I ? ", %" : "%") + Results[I].Name;
  O += " = ";

  auto PrintDict = [&](const std::vector<std::string> &Entries) {
    if (Entries.empty())
      return;
    O += " {";
    for (size_t I = 0; I < Entries.size(); ++I)
      O += (I ? ", " : "") + Entries[I];
    O += '}';
  };
  auto PrintTypeList = [&](auto Begin, auto End, auto Get) {
    for (auto It = Begin; It != End; ++It) {
      if (It != Begin)
        O += ", ";
      Get(*It).print(O);
    }
  };
  auto OperandType = [](const Operand &Op) -> const TensorType & {
    return Op.V->Type;
  };
  auto ResultType = [](const TensorType &T) -> const TensorType & { return T; };

  if (Generic) {
    O += "\"dlopt.";
    O += Spec.Op;
    O += "\"(";
    for (size_t I = 0; I < Spec.Operands.size(); ++I)
      O += (I ? ", %" : "%") + Spec.Operands[I].V->Name;
    O += ')';
    std::vector<std::string> Entries;
    for (const Keyword &K : Spec.Keywords)
      Entries.push_back(K.IsArray ? K.Name + " = " + denseArray(K.Values)
                                  : i64Attr(K.Name, K.Values[0]));
    if (!Spec.Segments.empty()) {
      std::string Seg = "operandSegmentSizes = array<i32";
      for (size_t I = 0; I < Spec.Segments.size(); ++I)
        Seg += (I ? ", " : ": ") + std::to_string(Spec.Segments[I]);
      Entries.push_back(Seg + ">");
    }
    Entries.insert(Entries.end(), Attrs.begin(), Attrs.end());
    PrintDict(Entries);
    O += " : (";
    PrintTypeList(Spec.Operands.begin(), Spec.Operands.end(), OperandType);
    O += ") -> ";
    if (Spec.Results.size() != 1)
      O += '(';
    PrintTypeList(Spec.Results.begin(), Spec.Results.end(), ResultType);
    if (Spec.Results.size() != 1)
      O += ')';
    O += '\n';
    return Results;
  }

  O += "dlopt.";
  O += Spec.Op;
  bool FirstPlain = true;
  for (const Operand &Op : Spec.Operands) {
    if (!Op.Prefix.empty()) {
      O += ' ' + Op.Prefix + "(%" + Op.V->Name + ')';
      continue;
    }
    O += FirstPlain ? " %" : ", %";
    O += Op.V->Name;
    FirstPlain = false;
  }
  for (const Keyword &K : Spec.Keywords) {
    O += ' ' + K.Name + " = ";
    O += K.IsArray ? shapeStr(K.Values) : std::to_string(K.Values[0]);
  }
  PrintDict(Attrs);
  O += " : ";
  switch (Spec.Style) {
  case TypeStyle::Same:
    (Spec.Operands.empty() ? Spec.Results[0] : Spec.Operands[0].V->Type)
        .print(O);
    break;
  case TypeStyle::Arrow:
    PrintTypeList(Spec.Operands.begin(), Spec.Operands.end(), OperandType);
    O += " -> ";
    PrintTypeList(Spec.Results.begin(), Spec.Results.end(), ResultType);
    break;
  case TypeStyle::Functional:
    O += '(';
    PrintTypeList(Spec.Operands.begin(), Spec.Operands.end(), OperandType);
    O += ") -> ";
    if (Spec.Results.size() != 1)
      O += '(';
    PrintTypeList(Spec.Results.begin(), Spec.Results.end(), ResultType);
    if (Spec.Results.size() != 1)
      O += ')';
    break;
  }
  O += '\n';
  return Results;
}

//===----------------------------------------------------------------------===//
// Ops
//===----------------------------------------------------------------------===//

Value ModelEmitter::unary(std::string_view Op, const Value &X,
                          std::string_view Name,
                          std::vector<std::string> Attrs) {
  OpSpec S{Op, {{&X, ""}}, {}, std::move(Attrs), TypeStyle::Same, {X.Type}};
  return emit(S, {Name})[0];
}

Value ModelEmitter::binary(std::string_view Op, const Value &A, const Value &B,
                           std::string_view Name) {
  if (A.Type.Elem != B.Type.Elem)
    internalError(Op, "element types differ");
  auto Shape = broadcastShapes(A.Type.Shape, B.Type.Shape);
  if (!Shape)
    internalError(Op, "shapes " + shapeStr(A.Type.Shape) + " and " +
                          shapeStr(B.Type.Shape) + " do not broadcast");
  OpSpec S{Op, {{&A, ""}, {&B, ""}}, {},
           {}, TypeStyle::Arrow,     {TensorType{*Shape, A.Type.Elem}}};
  return emit(S, {Name})[0];
}

Value ModelEmitter::cast(const Value &X, ElemType To, std::string_view Name) {
  OpSpec S{"cast", {{&X, ""}},       {},
           {},     TypeStyle::Arrow, {TensorType{X.Type.Shape, To}}};
  return emit(S, {Name})[0];
}

Value ModelEmitter::matmul(const Value &A, const Value &B,
                           std::string_view Name, bool TransposeA,
                           bool TransposeB) {
  const auto &SA = A.Type.Shape, &SB = B.Type.Shape;
  if (SA.size() < 2 || SB.size() < 2 || A.Type.Elem != B.Type.Elem ||
      !isFloat(A.Type.Elem))
    internalError("matmul", "bad operand types");
  int64_t M = TransposeA ? SA.back() : SA[SA.size() - 2];
  int64_t KA = TransposeA ? SA[SA.size() - 2] : SA.back();
  int64_t KB = TransposeB ? SB.back() : SB[SB.size() - 2];
  int64_t N = TransposeB ? SB[SB.size() - 2] : SB.back();
  if (KA != KB)
    internalError("matmul", "contraction sizes differ: " + shapeStr(SA) +
                                " x " + shapeStr(SB));
  auto Batch =
      broadcastShapes({SA.begin(), SA.end() - 2}, {SB.begin(), SB.end() - 2});
  if (!Batch)
    internalError("matmul", "batch dims do not broadcast");
  Batch->push_back(M);
  Batch->push_back(N);
  std::vector<std::string> Attrs;
  if (TransposeA)
    Attrs.push_back("transpose_a");
  if (TransposeB)
    Attrs.push_back("transpose_b");
  OpSpec S{"matmul",
           {{&A, ""}, {&B, ""}},
           {},
           std::move(Attrs),
           TypeStyle::Arrow,
           {TensorType{*Batch, A.Type.Elem}}};
  return emit(S, {Name})[0];
}

Value ModelEmitter::reshape(const Value &X, std::vector<int64_t> Shape,
                            std::string_view Name) {
  TensorType T{std::move(Shape), X.Type.Elem};
  if (T.numElements() != X.Type.numElements())
    internalError("reshape",
                  shapeStr(X.Type.Shape) + " -> " + shapeStr(T.Shape));
  OpSpec S{"reshape", {{&X, ""}}, {}, {}, TypeStyle::Arrow, {T}};
  return emit(S, {Name})[0];
}

Value ModelEmitter::transpose(const Value &X, const std::vector<int64_t> &Perm,
                              std::string_view Name) {
  if (static_cast<int64_t>(Perm.size()) != X.Type.rank())
    internalError("transpose", "perm rank");
  std::vector<int64_t> Shape;
  std::vector<bool> Seen(Perm.size());
  for (int64_t P : Perm) {
    if (P < 0 || P >= X.Type.rank() || Seen[P])
      internalError("transpose", "bad perm " + shapeStr(Perm));
    Seen[P] = true;
    Shape.push_back(X.Type.Shape[P]);
  }
  OpSpec S{"transpose", {{&X, ""}},       {{"perm", Perm}},
           {},          TypeStyle::Arrow, {TensorType{Shape, X.Type.Elem}}};
  return emit(S, {Name})[0];
}

Value ModelEmitter::gather(const Value &Table, const Value &Ids,
                           std::string_view Name) {
  if (Table.Type.rank() < 1 || !isInt(Ids.Type.Elem))
    internalError("gather", "bad operand types");
  std::vector<int64_t> Shape = Ids.Type.Shape;
  Shape.insert(Shape.end(), Table.Type.Shape.begin() + 1,
               Table.Type.Shape.end());
  OpSpec S{"gather",         {{&Table, ""}, {&Ids, ""}},          {}, {},
           TypeStyle::Arrow, {TensorType{Shape, Table.Type.Elem}}};
  return emit(S, {Name})[0];
}

Value ModelEmitter::iota(std::vector<int64_t> Shape, int64_t Dim, ElemType Elem,
                         std::string_view Name) {
  if (Dim < 0 || Dim >= static_cast<int64_t>(Shape.size()))
    internalError("iota", "bad dim");
  OpSpec S{"iota",
           {},
           {{"dim", {Dim}, false}},
           {},
           TypeStyle::Same,
           {TensorType{std::move(Shape), Elem}}};
  return emit(S, {Name})[0];
}

Value ModelEmitter::layerNorm(const Value &X, const Value *W, const Value *B,
                              int64_t Axis, double Eps, std::string_view Name) {
  std::vector<int64_t> Tail(X.Type.Shape.begin() + Axis, X.Type.Shape.end());
  OpSpec S{"layer_norm", {{&X, ""}}, {}, {}, TypeStyle::Functional, {X.Type}};
  for (auto [P, Prefix] : {std::pair{W, "weight"}, std::pair{B, "bias"}}) {
    if (!P)
      continue;
    if (P->Type != TensorType{Tail, X.Type.Elem})
      internalError("layer_norm", std::string(Prefix) + " type");
    S.Operands.push_back({P, Prefix});
  }
  S.Attrs = {"axis = " + std::to_string(Axis), f64Attr("eps", Eps)};
  S.Segments = {1, W ? 1 : 0, B ? 1 : 0};
  return emit(S, {Name})[0];
}

Value ModelEmitter::rmsNorm(const Value &X, const Value *W, int64_t Axis,
                            double Eps, std::string_view Name) {
  std::vector<int64_t> Tail(X.Type.Shape.begin() + Axis, X.Type.Shape.end());
  OpSpec S{"rms_norm", {{&X, ""}}, {}, {}, TypeStyle::Functional, {X.Type}};
  if (W) {
    if (W->Type != TensorType{Tail, X.Type.Elem})
      internalError("rms_norm", "weight type");
    S.Operands.push_back({W, "weight"});
  }
  S.Attrs = {"axis = " + std::to_string(Axis), f64Attr("eps", Eps)};
  return emit(S, {Name})[0];
}

Value ModelEmitter::attention(const Value &Q, const Value &K, const Value &V,
                              bool Causal, double Scale,
                              std::string_view Name) {
  const auto &SQ = Q.Type.Shape, &SK = K.Type.Shape, &SV = V.Type.Shape;
  if (SQ.size() != 4 || SK.size() != 4 || SV.size() != 4 || SQ[0] != SK[0] ||
      SK[0] != SV[0] || SK[1] != SV[1] || SQ[1] % SK[1] != 0 ||
      SQ[3] != SK[3] || SK[2] != SV[2])
    internalError("attention", "bad operand shapes");
  std::vector<std::string> Attrs;
  if (Causal)
    Attrs.push_back("causal");
  Attrs.push_back(f64Attr("scale", Scale));
  OpSpec S{"attention",
           {{&Q, ""}, {&K, ""}, {&V, ""}},
           {},
           std::move(Attrs),
           TypeStyle::Arrow,
           {TensorType{{SQ[0], SQ[1], SQ[2], SV[3]}, Q.Type.Elem}}};
  return emit(S, {Name})[0];
}

Value ModelEmitter::rope(const Value &X, double Theta, std::string_view Name) {
  if (X.Type.rank() != 4 || X.Type.Shape[3] % 2 != 0)
    internalError("rope", "bad operand shape");
  return unary("rope", X, Name, {f64Attr("theta", Theta)});
}

Value ModelEmitter::conv2d(const Value &X, const Value &W, const Value *B,
                           std::array<int64_t, 2> Stride,
                           std::array<int64_t, 2> Padding,
                           std::string_view Name) {
  const auto &SX = X.Type.Shape, &SW = W.Type.Shape;
  if (SX.size() != 4 || SW.size() != 4 || SX[1] != SW[1])
    internalError("conv2d", "bad operand shapes");
  std::vector<int64_t> Out = {
      SX[0], SW[0], windowOut("conv2d", SX[2], SW[2], Stride[0], Padding[0]),
      windowOut("conv2d", SX[3], SW[3], Stride[1], Padding[1])};
  OpSpec S{"conv2d", {{&X, ""}, {&W, ""}},  {},
           {},       TypeStyle::Functional, {TensorType{Out, X.Type.Elem}}};
  if (B) {
    if (B->Type != TensorType{{SW[0]}, X.Type.Elem})
      internalError("conv2d", "bias type");
    S.Operands.push_back({B, "bias"});
  }
  S.Attrs = {"stride = " + denseArray({Stride[0], Stride[1]}),
             "padding = " + denseArray({Padding[0], Padding[1]})};
  return emit(S, {Name})[0];
}

Value ModelEmitter::pool2d(std::string_view Op, const Value &X,
                           std::array<int64_t, 2> Kernel,
                           std::array<int64_t, 2> Stride,
                           std::array<int64_t, 2> Padding,
                           std::string_view Name) {
  const auto &SX = X.Type.Shape;
  if (SX.size() != 4)
    internalError(Op, "bad operand shape");
  std::vector<int64_t> Out = {
      SX[0], SX[1], windowOut(Op, SX[2], Kernel[0], Stride[0], Padding[0]),
      windowOut(Op, SX[3], Kernel[1], Stride[1], Padding[1])};
  OpSpec S{Op,
           {{&X, ""}},
           {},
           {"kernel = " + denseArray({Kernel[0], Kernel[1]}),
            "stride = " + denseArray({Stride[0], Stride[1]}),
            "padding = " + denseArray({Padding[0], Padding[1]})},
           TypeStyle::Arrow,
           {TensorType{Out, X.Type.Elem}}};
  return emit(S, {Name})[0];
}

std::array<Value, 3> ModelEmitter::batchNorm(const Value &X, const Value &W,
                                             const Value &B, const Value &Mean,
                                             const Value &Var, double Eps,
                                             double Momentum, bool Training,
                                             std::string_view Name) {
  if (X.Type.rank() < 2)
    internalError("batch_norm", "bad input rank");
  TensorType C{{X.Type.Shape[1]}, X.Type.Elem};
  for (const Value *P : {&W, &B, &Mean, &Var})
    if (P->Type != C)
      internalError("batch_norm", "per-channel operand type");
  std::vector<std::string> Attrs = {f64Attr("eps", Eps),
                                    f64Attr("momentum", Momentum)};
  if (Training)
    Attrs.push_back("training");
  OpSpec S{"batch_norm",
           {{&X, ""}, {&W, ""}, {&B, ""}, {&Mean, ""}, {&Var, ""}},
           {},
           std::move(Attrs),
           TypeStyle::Functional,
           {X.Type, C, C}};
  std::string Base(Name);
  std::string RM = Base + "_mean", RV = Base + "_var";
  auto R = emit(S, {Name, RM, RV});
  return {R[0], R[1], R[2]};
}

Value ModelEmitter::dropout(const Value &X, double Rate, int64_t Seed,
                            std::string_view Name) {
  return unary("dropout", X, Name,
               {f64Attr("rate", Rate), i64Attr("seed", Seed)});
}

Value ModelEmitter::crossEntropy(const Value &Logits, const Value &Labels,
                                 std::string_view Name) {
  const auto &SL = Logits.Type.Shape;
  if (SL.size() != 2 || Labels.Type.Shape != std::vector<int64_t>{SL[0]} ||
      !isInt(Labels.Type.Elem) || !isFloat(Logits.Type.Elem))
    internalError("cross_entropy", "bad operand types");
  OpSpec S{"cross_entropy",  {{&Logits, ""}, {&Labels, ""}},    {}, {},
           TypeStyle::Arrow, {TensorType{{}, Logits.Type.Elem}}};
  return emit(S, {Name})[0];
}

} // namespace dlopt::gen
