//===- ExportExecutable.h - dlopt IR to a runtime Executable --------------===//
#pragma once

#include "runtime/format/Executable.h"

#include "mlir/IR/BuiltinOps.h"

namespace dlopt {

/// Lowers the model's entry function (already checked by dlopt-check-model)
/// into a single-rank Executable: value table, instruction stream with
/// normalized attributes, constant blob and a liveness-based memory plan.
/// Emits an MLIR diagnostic at the offending op and fails on anything the
/// runtime cannot execute.
mlir::FailureOr<rt::Executable> exportExecutable(mlir::ModuleOp module,
                                                 llvm::StringRef entry,
                                                 llvm::StringRef sourceName);

} // namespace dlopt
