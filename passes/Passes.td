//===- Passes.td - dlopt passes ----------------------------*- tablegen -*-===//
#ifndef DLOPT_PASSES_TD
#define DLOPT_PASSES_TD

include "mlir/Pass/PassBase.td"

def CheckModelPass : Pass<"dlopt-check-model", "mlir::ModuleOp"> {
  let summary = "Checks the model conventions that compilation relies on";
  let description = [{
    Finds the entry function (`@main`, or the only public function) and
    checks that every argument is exactly one of `dlopt.param` or
    `dlopt.input`, that argument and output names are unique, that every
    result is a statically shaped tensor, that a `dlopt.loss` function
    returns a rank-0 float loss first, and that its body uses only ops the
    runtime can execute (dlopt ops, `arith.constant`, `func.return`).

    ```mlir
    // error: argument #1 (tensor<4x4xf32>) is neither a dlopt.param nor a dlopt.input
    func.func @main(%x: tensor<4x4xf32> {dlopt.input = "x"}, %w: tensor<4x4xf32>) ...
    ```
  }];
  let options = [
    Option<"entry", "entry", "std::string", /*default=*/"\"\"",
           "Name of the entry function (default: @main or the only public function)">
  ];
  let statistics = [
    Statistic<"numParams", "params", "Number of parameters">,
    Statistic<"numInputs", "inputs", "Number of inputs">
  ];
}

def AutodiffPass : Pass<"dlopt-autodiff", "mlir::ModuleOp"> {
  let summary = "Reverse-mode differentiation of the loss with respect to every dlopt.param";
  let description = [{
    Turns the entry function, which must be marked `dlopt.loss` and return a
    rank-0 float loss first, into a training-step function that returns the
    loss, the function's other results, and then the gradient of every
    `dlopt.param` in argument order. Gradient results are named
    `grad.<param>` and marked `dlopt.grad = "<param>"`. Each op's rule comes
    from its `AutodiffOpInterface`; backward ops are plain dlopt ops placed
    after the forward ops and carry the `dlopt.layer` mark of the op they
    differentiate. A parameter that does not reach the loss gets a warning
    and a zero gradient; a non-differentiable op on the path to the loss is
    an error naming the op.

    ```mlir
    // before
    func.func @main(%x: tensor<4xf32> {dlopt.input = "x"}, %w: tensor<4xf32> {dlopt.param = "w"})
        -> (tensor<f32> {dlopt.output = "loss"}) attributes {dlopt.loss} {
      %0 = dlopt.mse %x, %w : tensor<4xf32>, tensor<4xf32> -> tensor<f32>
      return %0 : tensor<f32>
    }
    // after: -> (tensor<f32> {dlopt.output = "loss"},
    //            tensor<4xf32> {dlopt.grad = "w", dlopt.output = "grad.w"})
    ```
  }];
  let options = [
    Option<"entry", "entry", "std::string", /*default=*/"\"\"",
           "Name of the entry function (default: @main or the only public function)">
  ];
  let statistics = [
    Statistic<"numGradOps", "grad-ops", "Number of ops created for the backward pass">,
    Statistic<"numZeroGrads", "zero-grads", "Parameters that do not reach the loss">
  ];
  let dependentDialects = ["::dlopt::dl::DLOptDialect", "::mlir::arith::ArithDialect"];
}

#endif // DLOPT_PASSES_TD
