//===- DType.h - Element types shared by compiler, format and backends ----===//
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dlopt::rt {

/// Element types of runtime tensors. `I1` is stored as one byte (0 or 1).
enum class DType : uint8_t { F32 = 0, F16 = 1, BF16 = 2, I32 = 3, I64 = 4, I1 = 5 };

inline int64_t dtypeSize(DType t) {
  switch (t) {
  case DType::F32: case DType::I32: return 4;
  case DType::F16: case DType::BF16: return 2;
  case DType::I64: return 8;
  case DType::I1: return 1;
  }
  return 0;
}

inline const char *dtypeName(DType t) {
  switch (t) {
  case DType::F32: return "f32";
  case DType::F16: return "f16";
  case DType::BF16: return "bf16";
  case DType::I32: return "i32";
  case DType::I64: return "i64";
  case DType::I1: return "i1";
  }
  return "?";
}

inline std::optional<DType> parseDType(std::string_view s) {
  if (s == "f32") return DType::F32;
  if (s == "f16") return DType::F16;
  if (s == "bf16") return DType::BF16;
  if (s == "i32") return DType::I32;
  if (s == "i64") return DType::I64;
  if (s == "i1") return DType::I1;
  return std::nullopt;
}

inline bool isFloat(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}
inline bool isInteger(DType t) { return t == DType::I32 || t == DType::I64; }

} // namespace dlopt::rt
