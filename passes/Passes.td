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

#endif // DLOPT_PASSES_TD
