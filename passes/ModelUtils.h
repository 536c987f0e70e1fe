//===- ModelUtils.h - Helpers for dlopt model functions -------------------===//
#pragma once

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"

namespace dlopt {

/// Finds the model's entry function: `entry` if given, else `@main`, else the
/// only public function. Emits an error on the module and fails otherwise.
mlir::FailureOr<mlir::func::FuncOp> findEntryFunction(mlir::ModuleOp module,
                                                      llvm::StringRef entry);

/// Stamps a stable id (`dlopt.id = N : i64`) on every op of `fn`'s body
/// that carries neither a `dlopt.id` nor a `dlopt.fwd_id`, numbering from
/// one past the largest id present (from 0 on a fresh model, so ids are the
/// program-order positions). dlopt-check-model runs it before the training
/// transforms; the planner's dry run runs it before summarizing, so both
/// number the same ops the same way. Returns the number of ops stamped.
unsigned stampOpIds(mlir::func::FuncOp fn);

/// Whether `name` is an op-identity attribute (`dlopt.id`, `dlopt.fwd_id`,
/// `dlopt.mb`): transforms that group ops by their dlopt.* marks (fusion)
/// ignore these, since every op has its own.
bool isOpIdentityAttr(llvm::StringRef name);

/// `op`'s discardable attributes without the identity attributes.
mlir::DictionaryAttr marksWithoutIds(mlir::Operation *op);

/// The module's `dlopt.mesh` attribute: {axes = [names], shape = sizes},
/// major first.
mlir::DictionaryAttr meshAttr(mlir::MLIRContext *ctx,
                              llvm::ArrayRef<mlir::Attribute> axes,
                              llvm::ArrayRef<int64_t> shape);

/// The index of mesh axis `name` in the module's `dlopt.mesh` (a
/// collective's grid axis), or -1 when the module has no such axis.
int meshAxisIndex(mlir::ModuleOp module, llvm::StringRef name);

/// Records on every op in [begin, end) of one block that `from` derives
/// from: `dlopt.fwd_id` = from's `dlopt.id` (or its `dlopt.fwd_id` when
/// `from` is itself derived), and drops any `dlopt.id` a clone copied.
void markDerivedOps(mlir::Operation *from, mlir::Block::iterator begin,
                    mlir::Block::iterator end);
/// The same for one op.
void markDerivedOp(mlir::Operation *from, mlir::Operation *op);

} // namespace dlopt
