//===- MlirFuzzer.cpp - Fuzzes parsing and verifying dlopt IR -------------===//
//
// What dlopt-compile and dlopt-opt do first with a model file: parse it with
// the dlopt, func, arith and shard dialects (dlopt-opt's registry) and
// verify it (custom parsers, builders' type inference, every op verifier).
// Diagnostics are swallowed. IR that verifies must print and parse back
// (custom and generic form) and verify again, as the lit round trips assume.
// Only dlopt's code is instrumented for coverage: Debian's MLIR libraries
// are not, so the fuzzer steers by the dialect's parsers and verifiers.
//
//===----------------------------------------------------------------------===//
#include "dialects/DLOpt/IR/DLOptDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardDialect.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OperationSupport.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

[[noreturn]] void fail(const char *what, const std::string &ir) {
  std::fprintf(stderr, "property failed: %s\n%s\n", what, ir.c_str());
  std::abort();
}

std::string print(mlir::ModuleOp module, bool generic) {
  std::string text;
  llvm::raw_string_ostream os(text);
  mlir::OpPrintingFlags flags;
  if (generic)
    flags.printGenericOpForm();
  module->print(os, flags);
  return text;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mlir::DialectRegistry registry;
  registry.insert<dlopt::dl::DLOptDialect, mlir::func::FuncDialect,
                  mlir::arith::ArithDialect, mlir::shard::ShardDialect>();
  // A fresh context per input: nothing uniqued by one input leaks into the
  // next, so a crash reproduces from its input alone.
  mlir::MLIRContext ctx(registry, mlir::MLIRContext::Threading::DISABLED);
  ctx.loadAllAvailableDialects();
  mlir::ScopedDiagnosticHandler swallow(
      &ctx, [](mlir::Diagnostic &) { return mlir::success(); });

  // A std::string keeps the NUL after the text that MLIR's lexer expects.
  std::string text(reinterpret_cast<const char *>(data), size);
  mlir::ParserConfig config(&ctx);
  mlir::OwningOpRef<mlir::ModuleOp> module =
      mlir::parseSourceString<mlir::ModuleOp>(text, config, "fuzz");
  if (!module || mlir::failed(mlir::verify(*module)))
    return 0;
  for (bool generic : {false, true}) {
    std::string printed = print(*module, generic);
    mlir::OwningOpRef<mlir::ModuleOp> again =
        mlir::parseSourceString<mlir::ModuleOp>(printed, config, "printed");
    if (!again)
      fail(generic ? "the generic form does not parse back"
                   : "the printed IR does not parse back",
           printed);
    if (mlir::failed(mlir::verify(*again)))
      fail("the printed IR does not verify after parsing back", printed);
  }
  return 0;
}
