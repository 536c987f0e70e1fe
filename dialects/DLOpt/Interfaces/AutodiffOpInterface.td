//===- AutodiffOpInterface.td - Reverse-mode gradient rules -*- tablegen -*-===//
#ifndef DLOPT_AUTODIFF_OP_INTERFACE_TD
#define DLOPT_AUTODIFF_OP_INTERFACE_TD

include "mlir/IR/OpBase.td"

def DLOpt_AutodiffOpInterface : OpInterface<"AutodiffOpInterface"> {
  let description = [{
    The reverse-mode gradient rule of a differentiable op. `dlopt-autodiff`
    calls it with the gradient of each result (null where a result receives
    none) and the builder positioned where the backward ops go; the rule
    emits plain dlopt ops and returns one gradient per operand (null for
    operands that get none, such as integer ids or labels). Gradients have
    exactly the operand's type: broadcasting rules reduce back to it.
  }];
  let cppNamespace = "::dlopt::dl";
  let methods = [
    InterfaceMethod<
      "Builds the operand gradients from the result gradients.",
      "::llvm::LogicalResult", "buildGradients",
      (ins "::mlir::OpBuilder &":$builder,
           "::mlir::ArrayRef<::mlir::Value>":$resultGrads,
           "::llvm::SmallVectorImpl<::mlir::Value> &":$operandGrads)>
  ];
}

#endif // DLOPT_AUTODIFF_OP_INTERFACE_TD
