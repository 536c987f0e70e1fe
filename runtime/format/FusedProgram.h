//===- FusedProgram.h - The per-element program of fused_elementwise ------===//
//
// A `fused_elementwise` instruction runs a small straight-line program once
// per element of its fused shape (the shape of every result). The program
// lives in three instruction attributes (docs/executable-format.md):
//
//   code    int list: per step its opcode and operand registers, three
//           ints for most steps (opcode, a, b) and four for `select`
//           (opcode, cond, a, b)
//   consts  float list, the scalar constants (absent = none)
//   outputs int list, the register each result is read from
//
// Registers are numbered inputs first (the instruction's operands, in
// order), then constants, then one register per step in order, so a step may
// read only registers defined before it. Unary steps have b = -1; `cast`
// steps have b = the target DType (f32, f16 or bf16) and round to it.
// Comparison steps (`cmp_eq` ... `cmp_ge`) write 1.0 where the comparison
// holds and 0.0 where it does not (NaN compares unequal to everything);
// `select cond, a, b` is a where cond != 0 and b elsewhere. That is how the
// dialect's i1 compare/select chains (ReLU's gradient) live inside a group:
// the i1 values never leave it.
//
// Semantics: registers hold f32; inputs are widened to f32 when loaded
// (rank-0 inputs are broadcast), and only the results are rounded to their
// element type when stored. Every operand and result is a float tensor.
//
// Multi-tensor form: an optional int attribute `segments` = N (absent = 1)
// runs the one program over N independent tensor segments in one
// instruction. Operands and results are segment-major: segment s owns
// operands [s*K, (s+1)*K) and results [s*R, (s+1)*R) with K = #operands / N
// (the program's inputs) and R = #results / N (its outputs). Each segment
// has its own fused shape; operand k (result j) has the same element type
// and rank-0-ness (element type) in every segment.
//
// The compiler (dlopt-fuse-elementwise and the exporter), the validator
// (Executable::validate), the dump and both backends share this header.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/format/Executable.h"

#include <cstdint>
#include <string>
#include <vector>

namespace dlopt::rt::fused {

/// The instruction's op name.
inline constexpr const char *kOpName = "fused_elementwise";

/// Size limits every backend supports (the CUDA kernel keeps the program in
/// its launch parameters); the compiler never builds a bigger group.
inline constexpr int kMaxInputs = 16;
inline constexpr int kMaxOutputs = 8;
inline constexpr int kMaxConsts = 32;
inline constexpr int kMaxSteps = 64;
inline constexpr int kMaxRegisters = kMaxInputs + kMaxConsts + kMaxSteps;
/// Most segments of one multi-tensor instruction (backends may split a
/// launch; this bounds what a reader accepts).
inline constexpr int64_t kMaxSegments = 65536;

/// Opcodes as stored in `code`. The numbers are part of the format.
enum class OpCode : int32_t {
  // unary
  Neg = 0, Abs = 1, Relu = 2, Exp = 3, Log = 4, Sqrt = 5, Rsqrt = 6,
  Tanh = 7, Sin = 8, Cos = 9, Sigmoid = 10, Silu = 11, Gelu = 12,
  GeluTanh = 13,
  Cast = 14, ///< b = target DType (F32, F16, BF16): rounds to it
  // binary
  Add = 20, Sub = 21, Mul = 22, Div = 23, Max = 24, Min = 25, Pow = 26,
  // comparisons (binary): 1.0 where true, 0.0 where false
  CmpEq = 30, CmpNe = 31, CmpLt = 32, CmpLe = 33, CmpGt = 34, CmpGe = 35,
  // ternary: select cond, a, b = cond != 0 ? a : b
  Select = 40,
};

/// The mnemonic of an opcode ("mul", "gelu_tanh", "cmp_gt"), or nullptr if
/// unknown.
const char *opCodeName(int32_t code);
/// The opcode of a dlopt op mnemonic (gelu with approximate="tanh" is
/// "gelu_tanh", compare with predicate P is "cmp_P"); false if the op
/// cannot be fused.
bool opCodeFromName(const std::string &name, OpCode &code);
/// Steps that read two registers (a, b): arithmetic and comparisons.
inline bool isBinary(OpCode c) {
  return int32_t(c) >= int32_t(OpCode::Add) &&
         int32_t(c) <= int32_t(OpCode::CmpGe);
}
inline bool isCompare(OpCode c) {
  return int32_t(c) >= int32_t(OpCode::CmpEq) &&
         int32_t(c) <= int32_t(OpCode::CmpGe);
}
/// Steps that read three registers (select: c ? a : b, stored as a = cond,
/// b = the true value, c = the false value).
inline bool isTernary(OpCode c) { return c == OpCode::Select; }
/// Ints a step takes in `code`: 4 for ternary steps, else 3.
inline int codeWidth(OpCode c) { return isTernary(c) ? 4 : 3; }

struct Step {
  OpCode op = OpCode::Neg;
  int32_t a = -1, b = -1;
  int32_t c = -1; ///< ternary steps only (select's false value)
  bool operator==(const Step &o) const {
    return op == o.op && a == o.a && b == o.b && c == o.c;
  }
};

struct Program {
  int32_t numSegments = 1; ///< tensor segments (multi-tensor form if > 1)
  int32_t numInputs = 0;   ///< per segment
  std::vector<double> consts;
  std::vector<Step> steps;
  std::vector<int32_t> outputs;

  int32_t numRegisters() const {
    return numInputs + int32_t(consts.size()) + int32_t(steps.size());
  }
  bool operator==(const Program &o) const {
    return numSegments == o.numSegments && numInputs == o.numInputs &&
           consts == o.consts &&
           steps == o.steps && outputs == o.outputs;
  }
};

/// Writes the program's attributes (code, consts, outputs, and segments
/// when more than one) into `instr`.
void encode(const Program &p, Instr &instr);

/// Reads and checks the program of `instr` against its operand and result
/// types: attributes present and well-typed, known opcodes, registers in
/// range and defined before use, limits, float operand/result types, every
/// result of one shape and every operand of that shape or rank 0 (per
/// segment, with the same types in every segment). The error
/// message does not name the instruction; callers prefix it.
Expected<Program> decode(const Instr &instr,
                         const std::vector<TensorType> &operandTypes,
                         const std::vector<TensorType> &resultTypes);

/// "r3 = mul r0, c0; r4 = sqrt r3 -> r4" style, for --dump.
std::string describe(const Program &p);

} // namespace dlopt::rt::fused
