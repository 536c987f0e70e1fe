//===- DLOptDialect.h - The dlopt dialect ---------------------------------===//
#pragma once

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Dialect.h"

#include "dialects/DLOpt/IR/DLOptDialect.h.inc"
