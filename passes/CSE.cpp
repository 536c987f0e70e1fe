//===- CSE.cpp - Common subexpression elimination ignoring op identity ----===//
//
// Stable op ids (dlopt.id, dlopt.fwd_id, dlopt.mb) are unique per op, so
// upstream CSE, which compares every attribute, would never merge two equal
// ops of a model. This pass merges them up to those attributes; upstream
// CSE runs after it for anything else.
//
//===----------------------------------------------------------------------===//
#include "passes/ModelUtils.h"
#include "passes/Passes.h"

#include "mlir/IR/OperationSupport.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/DenseMap.h"

#define DEBUG_TYPE "dlopt-cse"

namespace dlopt {
#define GEN_PASS_DEF_IDENTITYCSEPASS
#include "passes/Passes.h.inc"
} // namespace dlopt

using namespace mlir;
using namespace dlopt;

namespace {

constexpr auto kFlags = OperationEquivalence::Flags(
    OperationEquivalence::IgnoreLocations |
    OperationEquivalence::IgnoreDiscardableAttrs);

/// Ops keyed by their operation, operands, properties and marks (the
/// discardable attributes but the identity ones).
struct OpKeyInfo : llvm::DenseMapInfo<Operation *> {
  static unsigned getHashValue(const Operation *cop) {
    auto *op = const_cast<Operation *>(cop);
    return llvm::hash_combine(
        OperationEquivalence::computeHash(
            op, OperationEquivalence::directHashValue,
            OperationEquivalence::ignoreHashValue, kFlags),
        marksWithoutIds(op));
  }
  static bool isEqual(const Operation *clhs, const Operation *crhs) {
    auto *lhs = const_cast<Operation *>(clhs);
    auto *rhs = const_cast<Operation *>(crhs);
    if (lhs == rhs)
      return true;
    if (lhs == getEmptyKey() || lhs == getTombstoneKey() ||
        rhs == getEmptyKey() || rhs == getTombstoneKey())
      return false;
    return OperationEquivalence::isEquivalentTo(
               lhs, rhs, OperationEquivalence::exactValueMatch,
               /*markEquivalent=*/nullptr, kFlags) &&
           marksWithoutIds(lhs) == marksWithoutIds(rhs);
  }
};

struct IdentityCSEPass
    : dlopt::impl::IdentityCSEPassBase<IdentityCSEPass> {
  using IdentityCSEPassBase::IdentityCSEPassBase;

  void runOnOperation() override {
    FunctionOpInterface fn = getOperation();
    for (Block &block : fn.getFunctionBody()) {
      llvm::DenseMap<Operation *, Operation *, OpKeyInfo> seen;
      for (Operation &op : llvm::make_early_inc_range(block)) {
        if (op.getNumRegions() != 0 || op.getNumResults() == 0 ||
            op.hasTrait<OpTrait::IsTerminator>() || !isMemoryEffectFree(&op))
          continue;
        auto [it, inserted] = seen.try_emplace(&op, &op);
        if (inserted)
          continue;
        op.replaceAllUsesWith(it->second);
        op.erase();
        ++numMerged;
      }
    }
  }
};

} // namespace
