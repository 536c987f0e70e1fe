//===- AutodiffOpInterface.h - Reverse-mode gradient rules ----------------===//
#pragma once

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpDefinition.h"

#include "dialects/DLOpt/Interfaces/AutodiffOpInterface.h.inc"
