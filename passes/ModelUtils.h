//===- ModelUtils.h - Helpers for dlopt model functions -------------------===//
#pragma once

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"

namespace dlopt {

/// Finds the model's entry function: `entry` if given, else `@main`, else the
/// only public function. Emits an error on the module and fails otherwise.
mlir::FailureOr<mlir::func::FuncOp> findEntryFunction(mlir::ModuleOp module,
                                                      llvm::StringRef entry);

} // namespace dlopt
