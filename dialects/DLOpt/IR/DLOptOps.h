//===- DLOptOps.h - dlopt ops ---------------------------------------------===//
#pragma once

#include "dialects/DLOpt/IR/DLOptDialect.h"
#include "dialects/DLOpt/Interfaces/AutodiffOpInterface.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "dialects/DLOpt/IR/DLOptEnums.h.inc"

namespace dlopt::dl {

/// Infers the NumPy-broadcast result type of elementwise operands. All
/// operands must share an element type unless `resultElement` is given, in
/// which case the result uses it (e.g. i1 for compare). The first operand of
/// `select` is the condition and is excluded from the element check by the
/// caller.
llvm::LogicalResult inferBroadcastResult(std::optional<mlir::Location> loc,
                                         llvm::StringRef opName,
                                         llvm::ArrayRef<mlir::Type> operands,
                                         mlir::Type resultElement,
                                         llvm::SmallVectorImpl<mlir::Type> &types);

/// Broadcasts two shapes by NumPy rules; false if incompatible.
bool broadcastShapes(llvm::ArrayRef<int64_t> a, llvm::ArrayRef<int64_t> b,
                     llvm::SmallVectorImpl<int64_t> &out);

/// Normalizes a possibly negative dim into [0, rank); -1 if out of range.
int64_t normalizeDim(int64_t dim, int64_t rank);

} // namespace dlopt::dl

#define GET_OP_CLASSES
#include "dialects/DLOpt/IR/DLOptOps.h.inc"

namespace dlopt::dl {
/// Infers the result type of a reduction over `dims`.
llvm::LogicalResult inferReduceResult(std::optional<mlir::Location> loc,
                                      llvm::StringRef opName, mlir::Type input,
                                      llvm::ArrayRef<int64_t> dims,
                                      bool keepdims,
                                      llvm::SmallVectorImpl<mlir::Type> &types);
} // namespace dlopt::dl
