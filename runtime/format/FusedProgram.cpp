//===- FusedProgram.cpp - Encoding and checking fused_elementwise programs ===//
//
// decode() is part of the reader's gate (Executable::validate), so it
// assumes nothing about the attributes: every index is range-checked before
// a backend ever evaluates the program.
//
//===----------------------------------------------------------------------===//

#include "runtime/format/FusedProgram.h"

#include <sstream>

namespace dlopt::rt::fused {

namespace {

struct NamedCode {
  OpCode code;
  const char *name;
};
constexpr NamedCode kCodes[] = {
    {OpCode::Neg, "neg"},       {OpCode::Abs, "abs"},
    {OpCode::Relu, "relu"},     {OpCode::Exp, "exp"},
    {OpCode::Log, "log"},       {OpCode::Sqrt, "sqrt"},
    {OpCode::Rsqrt, "rsqrt"},   {OpCode::Tanh, "tanh"},
    {OpCode::Sin, "sin"},       {OpCode::Cos, "cos"},
    {OpCode::Sigmoid, "sigmoid"}, {OpCode::Silu, "silu"},
    {OpCode::Gelu, "gelu"},     {OpCode::GeluTanh, "gelu_tanh"},
    {OpCode::Cast, "cast"},     {OpCode::Add, "add"},
    {OpCode::Sub, "sub"},       {OpCode::Mul, "mul"},
    {OpCode::Div, "div"},       {OpCode::Max, "maximum"},
    {OpCode::Min, "minimum"},   {OpCode::Pow, "pow"},
    {OpCode::CmpEq, "cmp_eq"},  {OpCode::CmpNe, "cmp_ne"},
    {OpCode::CmpLt, "cmp_lt"},  {OpCode::CmpLe, "cmp_le"},
    {OpCode::CmpGt, "cmp_gt"},  {OpCode::CmpGe, "cmp_ge"},
    {OpCode::Select, "select"},
};

std::string str(int64_t v) { return std::to_string(v); }

} // namespace

const char *opCodeName(int32_t code) {
  for (const NamedCode &c : kCodes)
    if (int32_t(c.code) == code)
      return c.name;
  return nullptr;
}

bool opCodeFromName(const std::string &name, OpCode &code) {
  for (const NamedCode &c : kCodes)
    if (name == c.name) {
      code = c.code;
      return true;
    }
  return false;
}

void encode(const Program &p, Instr &instr) {
  std::vector<int64_t> code;
  code.reserve(p.steps.size() * 4);
  for (const Step &s : p.steps) {
    code.push_back(int64_t(s.op));
    code.push_back(s.a);
    code.push_back(s.b);
    if (isTernary(s.op))
      code.push_back(s.c);
  }
  instr.attrs["code"] = code;
  if (!p.consts.empty())
    instr.attrs["consts"] = p.consts;
  else
    instr.attrs.erase("consts");
  instr.attrs["outputs"] =
      std::vector<int64_t>(p.outputs.begin(), p.outputs.end());
  if (p.numSegments > 1)
    instr.attrs["segments"] = int64_t(p.numSegments);
  else
    instr.attrs.erase("segments");
}

Expected<Program> decode(const Instr &instr,
                         const std::vector<TensorType> &operandTypes,
                         const std::vector<TensorType> &resultTypes) {
  auto err = [](const std::string &m) { return Status::error(m); };
  Program p;
  if (resultTypes.empty())
    return err("fused program has no results");
  int64_t segs = 1;
  if (instr.hasAttr("segments")) {
    auto v = instr.getInt("segments");
    if (!v)
      return err(v.status().message());
    segs = *v;
    if (segs < 1 || segs > kMaxSegments)
      return err("attribute 'segments' is " + str(segs) + ", expected 1 to " +
                 str(kMaxSegments));
    if (operandTypes.size() % size_t(segs) != 0 ||
        resultTypes.size() % size_t(segs) != 0)
      return err("the " + str(operandTypes.size()) + " operands and " +
                 str(resultTypes.size()) + " results do not split evenly into " +
                 str(segs) + " segments");
  }
  p.numSegments = int32_t(segs);
  const size_t numIn = operandTypes.size() / size_t(segs);
  const size_t numOut = resultTypes.size() / size_t(segs);
  if (numOut == 0)
    return err("fused program has no results");
  if (numIn > size_t(kMaxInputs))
    return err("fused program has " + str(numIn) +
               " inputs, at most " + str(kMaxInputs) + " are supported");
  if (numOut > size_t(kMaxOutputs))
    return err("fused program has " + str(numOut) +
               " results, at most " + str(kMaxOutputs) + " are supported");
  for (size_t s = 0; s < size_t(segs); ++s) {
    const std::string seg =
        segs > 1 ? "segment " + str(s) + ": " : std::string();
    size_t r0 = s * numOut, o0 = s * numIn;
    const std::vector<int64_t> &shape = resultTypes[r0].shape;
    for (size_t i = r0; i < r0 + numOut; ++i) {
      if (!isFloat(resultTypes[i].dtype))
        return err(seg + "result #" + str(i) + " is " + resultTypes[i].str() +
                   ", expected a float type (f32, f16 or bf16)");
      if (resultTypes[i].shape != shape)
        return err(seg + "result #" + str(i) + " is " + resultTypes[i].str() +
                   ", expected the fused shape of result #" + str(r0) + " (" +
                   resultTypes[r0].str() + ")");
      if (resultTypes[i].dtype != resultTypes[i - r0].dtype)
        return err(seg + "result #" + str(i) + " is " + resultTypes[i].str() +
                   ", expected the element type of result #" + str(i - r0) +
                   " (" + resultTypes[i - r0].str() + ")");
    }
    for (size_t i = o0; i < o0 + numIn; ++i) {
      if (!isFloat(operandTypes[i].dtype))
        return err(seg + "operand #" + str(i) + " is " +
                   operandTypes[i].str() +
                   ", expected a float type (f32, f16 or bf16)");
      if (!operandTypes[i].shape.empty() && operandTypes[i].shape != shape)
        return err(seg + "operand #" + str(i) + " is " +
                   operandTypes[i].str() +
                   ", expected the fused shape of the results or rank 0");
      const TensorType &first = operandTypes[i - o0];
      if (operandTypes[i].dtype != first.dtype ||
          operandTypes[i].shape.empty() != first.shape.empty())
        return err(seg + "operand #" + str(i) + " is " +
                   operandTypes[i].str() +
                   ", expected the element type and rank-0-ness of operand #" +
                   str(i - o0) + " (" + first.str() + ")");
    }
  }
  p.numInputs = int32_t(numIn);

  if (instr.hasAttr("consts")) {
    const AttrValue &v = instr.attrs.at("consts");
    if (auto *d = std::get_if<std::vector<double>>(&v))
      p.consts = *d;
    else if (auto *n = std::get_if<std::vector<int64_t>>(&v); !n || !n->empty())
      return err("attribute 'consts' expected a float list");
  }
  if (p.consts.size() > size_t(kMaxConsts))
    return err("fused program has " + str(p.consts.size()) +
               " constants, at most " + str(kMaxConsts) + " are supported");

  auto code = instr.getInts("code");
  if (!code)
    return err(code.status().message());
  int32_t firstStep = p.numInputs + int32_t(p.consts.size());
  const std::vector<int64_t> &cs = *code;
  for (size_t pos = 0, s = 0; pos < cs.size(); ++s) {
    std::string where = "step " + str(int64_t(s)) + ": ";
    int64_t op = cs[pos];
    if (op < 0 || op > 1000 || !opCodeName(int32_t(op)))
      return err(where + "unknown opcode " + str(op));
    Step st;
    st.op = OpCode(op);
    const char *name = opCodeName(int32_t(op));
    size_t width = size_t(codeWidth(st.op));
    if (cs.size() - pos < width)
      return err(where + "'" + name + "' needs " + str(int64_t(width)) +
                 " ints (opcode and operands), attribute 'code' ends after " +
                 str(int64_t(cs.size() - pos)));
    int64_t a = cs[pos + 1], b = cs[pos + 2],
            c = width > 3 ? cs[pos + 3] : -1;
    pos += width;
    int64_t defined = firstStep + int64_t(s); // registers [0, defined)
    auto checkReg = [&](int64_t r) -> Status {
      if (r < 0 || r >= defined)
        return err(where + "'" + name + "' reads register " + str(r) +
                   ", expected one of the " + str(defined) +
                   " registers defined before it");
      return Status::ok();
    };
    DLOPT_RETURN_IF_ERROR(checkReg(a));
    st.a = int32_t(a);
    if (isBinary(st.op) || isTernary(st.op)) {
      DLOPT_RETURN_IF_ERROR(checkReg(b));
    } else if (st.op == OpCode::Cast) {
      if (b < 0 || b > 255 || !isFloat(DType(b)))
        return err(where + "'cast' has target type " + str(b) +
                   ", expected f32 (0), f16 (1) or bf16 (2)");
    } else if (b != -1) {
      return err(where + "unary '" + name + "' has operand b = " + str(b) +
                 ", expected -1");
    }
    st.b = int32_t(b);
    if (isTernary(st.op)) {
      DLOPT_RETURN_IF_ERROR(checkReg(c));
      st.c = int32_t(c);
    }
    p.steps.push_back(st);
  }
  if (p.steps.empty())
    return err("fused program has no steps");
  if (p.steps.size() > size_t(kMaxSteps))
    return err("fused program has " + str(int64_t(p.steps.size())) +
               " steps, at most " + str(kMaxSteps) + " are supported");

  auto outs = instr.getInts("outputs");
  if (!outs)
    return err(outs.status().message());
  if (outs->size() != numOut)
    return err("attribute 'outputs' names " + str(outs->size()) +
               " registers, expected one per result (" + str(numOut) +
               (segs > 1 ? " per segment" : "") + ")");
  int32_t numRegs = p.numRegisters();
  for (size_t i = 0; i < outs->size(); ++i) {
    int64_t r = (*outs)[i];
    if (r < 0 || r >= numRegs)
      return err("result #" + str(i) + " reads register " + str(r) +
                 ", out of range [0, " + str(numRegs) + ")");
    p.outputs.push_back(int32_t(r));
  }
  return p;
}

std::string describe(const Program &p) {
  std::ostringstream os;
  int32_t firstConst = p.numInputs;
  int32_t firstStep = firstConst + int32_t(p.consts.size());
  auto reg = [&](int32_t r) {
    if (r < firstConst)
      return "in" + str(r);
    if (r < firstStep) {
      std::ostringstream c;
      c << p.consts[size_t(r - firstConst)];
      return c.str();
    }
    return "t" + str(r - firstStep);
  };
  for (size_t s = 0; s < p.steps.size(); ++s) {
    const Step &st = p.steps[s];
    os << (s ? "; " : "") << "t" << s << " = " << opCodeName(int32_t(st.op))
       << " " << reg(st.a);
    if (isBinary(st.op) || isTernary(st.op))
      os << ", " << reg(st.b);
    if (isTernary(st.op))
      os << ", " << reg(st.c);
    else if (st.op == OpCode::Cast)
      os << " to " << dtypeName(DType(st.b));
  }
  os << " -> ";
  for (size_t i = 0; i < p.outputs.size(); ++i)
    os << (i ? ", " : "") << reg(p.outputs[i]);
  if (p.numSegments > 1)
    os << "  (x" << p.numSegments << " segments)";
  return os.str();
}

} // namespace dlopt::rt::fused
