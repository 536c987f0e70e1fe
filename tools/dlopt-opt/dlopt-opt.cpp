//===- dlopt-opt.cpp - mlir-opt style driver with the dlopt dialect -------===//
#include "dialects/DLOpt/IR/DLOptDialect.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardDialect.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  registry.insert<dlopt::dl::DLOptDialect, mlir::func::FuncDialect,
                  mlir::arith::ArithDialect, mlir::shard::ShardDialect>();
  mlir::registerTransformsPasses();
  dlopt::registerAllPasses();
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "dlopt optimizer driver\n", registry));
}
