//===- DLOptOps.td - dlopt op definitions ------------------*- tablegen -*-===//
//
// Numeric semantics of every op are specified in docs/ops.md.
//
//===----------------------------------------------------------------------===//
#ifndef DLOPT_OPS_TD
#define DLOPT_OPS_TD

include "dialects/DLOpt/IR/DLOptDialect.td"
include "mlir/IR/BuiltinAttributes.td"
include "mlir/IR/EnumAttr.td"
include "mlir/IR/CommonAttrConstraints.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "dialects/DLOpt/Interfaces/AutodiffOpInterface.td"

//===----------------------------------------------------------------------===//
// Type constraints
//===----------------------------------------------------------------------===//

class DLOpt_TensorOf<list<Type> types, string what>
    : RankedTensorOf<types, [HasStaticShapePred], "statically shaped " # what # " tensor">;

def DLOpt_AnyTensor : DLOpt_TensorOf<[F32, F16, BF16, I32, I64, I1], "f32/f16/bf16/i32/i64/i1">;
def DLOpt_NumTensor : DLOpt_TensorOf<[F32, F16, BF16, I32, I64], "f32/f16/bf16/i32/i64">;
def DLOpt_FloatTensor : DLOpt_TensorOf<[F32, F16, BF16], "f32/f16/bf16">;
def DLOpt_IntTensor : DLOpt_TensorOf<[I32, I64], "i32/i64">;
def DLOpt_BoolTensor : DLOpt_TensorOf<[I1], "i1">;
def DLOpt_FloatScalar : RankedTensorOf<[F32, F16, BF16], [HasAnyRankOfPred<[0]>], "rank-0 f32/f16/bf16 tensor">;

/// A 64-bit signless integer attribute read back as a signed value (upstream
/// I64Attr returns uint64_t, which would turn dim = -1 into 2^64 - 1).
/// Differentiable ops implement their rule in DLOptGradients.cpp.
defvar Differentiable = DeclareOpInterfaceMethods<DLOpt_AutodiffOpInterface>;

def DLOpt_I64Attr : SignlessIntegerAttrBase<I64, "64-bit signless integer attribute"> {
  let returnType = "int64_t";
  let convertFromStorage = "$_self.getValue().getSExtValue()";
}

def DLOpt_CmpPredicate : I32EnumAttr<"CmpPredicate", "comparison predicate", [
    I32EnumAttrCase<"eq", 0>, I32EnumAttrCase<"ne", 1>, I32EnumAttrCase<"lt", 2>,
    I32EnumAttrCase<"le", 3>, I32EnumAttrCase<"gt", 4>, I32EnumAttrCase<"ge", 5>]> {
  let cppNamespace = "::dlopt::dl";
}

//===----------------------------------------------------------------------===//
// Elementwise unary
//===----------------------------------------------------------------------===//

class DLOpt_UnaryOp<string mnemonic, Type T, string formula, list<Trait> traits = []>
    : DLOpt_Op<mnemonic, !listconcat([Pure, Elementwise, SameOperandsAndResultType, Differentiable], traits)> {
  let summary = "elementwise " # formula;
  let description = "Computes `" # formula # "` for every element; the result "
      # "has the operand's type. See docs/ops.md.\n\n"
      # "```mlir\n%y = dlopt." # mnemonic # " %x : tensor<4x8xf32>\n```";
  let arguments = (ins T:$input);
  let results = (outs T:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
}

def DLOpt_NegOp : DLOpt_UnaryOp<"neg", DLOpt_NumTensor, "-x"> { let hasFolder = 1; }
def DLOpt_AbsOp : DLOpt_UnaryOp<"abs", DLOpt_NumTensor, "|x|"> { let hasFolder = 1; }
def DLOpt_ReluOp : DLOpt_UnaryOp<"relu", DLOpt_NumTensor, "max(x, 0)">;
def DLOpt_ExpOp : DLOpt_UnaryOp<"exp", DLOpt_FloatTensor, "exp(x)">;
def DLOpt_LogOp : DLOpt_UnaryOp<"log", DLOpt_FloatTensor, "log(x)">;
def DLOpt_SqrtOp : DLOpt_UnaryOp<"sqrt", DLOpt_FloatTensor, "sqrt(x)">;
def DLOpt_RsqrtOp : DLOpt_UnaryOp<"rsqrt", DLOpt_FloatTensor, "1/sqrt(x)">;
def DLOpt_TanhOp : DLOpt_UnaryOp<"tanh", DLOpt_FloatTensor, "tanh(x)">;
def DLOpt_SinOp : DLOpt_UnaryOp<"sin", DLOpt_FloatTensor, "sin(x)">;
def DLOpt_CosOp : DLOpt_UnaryOp<"cos", DLOpt_FloatTensor, "cos(x)">;
def DLOpt_SigmoidOp : DLOpt_UnaryOp<"sigmoid", DLOpt_FloatTensor, "1/(1+exp(-x))">;
def DLOpt_SiluOp : DLOpt_UnaryOp<"silu", DLOpt_FloatTensor, "x*sigmoid(x)">;

def DLOpt_GeluOp : DLOpt_Op<"gelu", [Pure, Elementwise, SameOperandsAndResultType, Differentiable]> {
  let summary = "elementwise GELU, exact or tanh-approximated";
  let description = [{
    `approximate = "none"` (default) computes `0.5x(1+erf(x/sqrt(2)))`;
    `approximate = "tanh"` computes `0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3)))`.

    ```mlir
    %y = dlopt.gelu %x {approximate = "tanh"} : tensor<4x8xf32>
    ```
  }];
  let arguments = (ins DLOpt_FloatTensor:$input,
                       DefaultValuedStrAttr<StrAttr, "none">:$approximate);
  let results = (outs DLOpt_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def DLOpt_CastOp : DLOpt_Op<"cast", [Pure, Elementwise, SameOperandsAndResultShape, Differentiable]> {
  let summary = "elementwise conversion between element types";
  let description = [{
    Converts every element to the result's element type. float to int
    truncates toward zero and saturates; NaN becomes 0; to `i1` tests `x != 0`.

    ```mlir
    %y = dlopt.cast %x : tensor<4xf32> -> tensor<4xbf16>
    ```
  }];
  let arguments = (ins DLOpt_AnyTensor:$input);
  let results = (outs DLOpt_AnyTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasFolder = 1;
}

//===----------------------------------------------------------------------===//
// Elementwise binary with broadcasting
//===----------------------------------------------------------------------===//

class DLOpt_BinaryOp<string mnemonic, Type T, string formula>
    : DLOpt_Op<mnemonic, [Pure, InferTypeOpAdaptor, Differentiable]> {
  let summary = "elementwise " # formula # " with NumPy broadcasting";
  let description = "Computes `" # formula # "` elementwise. Operands have the "
      # "same element type; shapes broadcast as in NumPy.\n\n"
      # "```mlir\n%z = dlopt." # mnemonic
      # " %a, %b : tensor<4x8xf32>, tensor<8xf32> -> tensor<4x8xf32>\n```";
  let arguments = (ins T:$lhs, T:$rhs);
  let results = (outs T:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)";
  let extraClassDefinition = [{
    ::llvm::LogicalResult $cppClass::inferReturnTypes(
        ::mlir::MLIRContext *context, std::optional<::mlir::Location> loc,
        Adaptor adaptor, ::llvm::SmallVectorImpl<::mlir::Type> &types) {
      return ::dlopt::dl::inferBroadcastResult(loc, getOperationName(),
          {adaptor.getLhs().getType(), adaptor.getRhs().getType()},
          /*resultElement=*/nullptr, types);
    }
  }];
}

def DLOpt_AddOp : DLOpt_BinaryOp<"add", DLOpt_NumTensor, "a + b"> { let hasFolder = 1; }
def DLOpt_SubOp : DLOpt_BinaryOp<"sub", DLOpt_NumTensor, "a - b"> { let hasFolder = 1; }
def DLOpt_MulOp : DLOpt_BinaryOp<"mul", DLOpt_NumTensor, "a * b"> { let hasFolder = 1; }
def DLOpt_DivOp : DLOpt_BinaryOp<"div", DLOpt_NumTensor, "a / b"> { let hasFolder = 1; }
def DLOpt_MaximumOp : DLOpt_BinaryOp<"maximum", DLOpt_NumTensor, "max(a, b)"> { let hasFolder = 1; }
def DLOpt_MinimumOp : DLOpt_BinaryOp<"minimum", DLOpt_NumTensor, "min(a, b)"> { let hasFolder = 1; }
def DLOpt_PowOp : DLOpt_BinaryOp<"pow", DLOpt_FloatTensor, "a ^ b">;

def DLOpt_CompareOp : DLOpt_Op<"compare", [Pure, InferTypeOpAdaptor]> {
  let summary = "elementwise comparison giving i1, with broadcasting";
  let description = [{
    Compares with one of `eq, ne, lt, le, gt, ge`. Operands have the same
    element type; the result is `i1` of the broadcast shape.

    ```mlir
    %c = dlopt.compare lt, %a, %b : tensor<4x8xf32>, tensor<8xf32> -> tensor<4x8xi1>
    ```
  }];
  let arguments = (ins DLOpt_CmpPredicate:$predicate, DLOpt_NumTensor:$lhs, DLOpt_NumTensor:$rhs);
  let results = (outs DLOpt_BoolTensor:$result);
  let assemblyFormat = "$predicate `,` $lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)";
}

def DLOpt_SelectOp : DLOpt_Op<"select", [Pure, InferTypeOpAdaptor, Differentiable]> {
  let summary = "elementwise choice `cond ? a : b` with broadcasting";
  let description = [{
    All three operands broadcast together; `a` and `b` have the same element type.

    ```mlir
    %r = dlopt.select %c, %a, %b : tensor<4x8xi1>, tensor<4x8xf32>, tensor<f32> -> tensor<4x8xf32>
    ```
  }];
  let arguments = (ins DLOpt_BoolTensor:$cond, DLOpt_AnyTensor:$true_value, DLOpt_AnyTensor:$false_value);
  let results = (outs DLOpt_AnyTensor:$result);
  let assemblyFormat = "$cond `,` $true_value `,` $false_value attr-dict `:` type($cond) `,` type($true_value) `,` type($false_value) `->` type($result)";
}

//===----------------------------------------------------------------------===//
// Reductions
//===----------------------------------------------------------------------===//

class DLOpt_ReduceOp<string mnemonic, Type T, string what>
    : DLOpt_Op<mnemonic, [Pure, InferTypeOpAdaptor, Differentiable]> {
  let summary = what # " over a list of dims";
  let description = "Reduces with " # what # " over `dims` (distinct, in "
      # "`[-rank, rank)`); `keepdims` keeps them with size 1. An empty list is "
      # "the identity.\n\n```mlir\n%s = dlopt." # mnemonic
      # " %x dims = [1] keepdims : tensor<4x8xf32> -> tensor<4x1xf32>\n```";
  let arguments = (ins T:$input, DenseI64ArrayAttr:$dims, UnitAttr:$keepdims);
  let results = (outs T:$result);
  let assemblyFormat = "$input `dims` `=` $dims (`keepdims` $keepdims^)? attr-dict `:` type($input) `->` type($result)";
  let hasFolder = 1;
  let extraClassDefinition = [{
    ::llvm::LogicalResult $cppClass::inferReturnTypes(
        ::mlir::MLIRContext *context, std::optional<::mlir::Location> loc,
        Adaptor adaptor, ::llvm::SmallVectorImpl<::mlir::Type> &types) {
      return ::dlopt::dl::inferReduceResult(loc, getOperationName(),
          adaptor.getInput().getType(), adaptor.getDims(),
          adaptor.getKeepdims(), types);
    }
    ::mlir::OpFoldResult $cppClass::fold(FoldAdaptor) {
      if (getDims().empty() && getInput().getType() == getType())
        return getInput();
      return {};
    }
  }];
}

def DLOpt_SumOp : DLOpt_ReduceOp<"sum", DLOpt_NumTensor, "sum">;
def DLOpt_MeanOp : DLOpt_ReduceOp<"mean", DLOpt_FloatTensor, "arithmetic mean">;
def DLOpt_MaxOp : DLOpt_ReduceOp<"max", DLOpt_NumTensor, "maximum">;

//===----------------------------------------------------------------------===//
// Matmul
//===----------------------------------------------------------------------===//

def DLOpt_MatmulOp : DLOpt_Op<"matmul", [Pure, InferTypeOpAdaptor, Differentiable]> {
  let summary = "batched matrix product with broadcast batch dims";
  let description = [{
    `lhs` is `[..., M, K]` (`[..., K, M]` with `transpose_a`), `rhs` is
    `[..., K, N]` (`[..., N, K]` with `transpose_b`); both have rank >= 2 and
    the same float element type. Batch dims broadcast as in NumPy; the result
    is `[batch..., M, N]`, accumulated in f32.

    ```mlir
    %c = dlopt.matmul %a, %b {transpose_b} : tensor<2x4x8xf32>, tensor<16x8xf32> -> tensor<2x4x16xf32>
    ```
  }];
  let arguments = (ins DLOpt_FloatTensor:$lhs, DLOpt_FloatTensor:$rhs,
                       UnitAttr:$transpose_a, UnitAttr:$transpose_b);
  let results = (outs DLOpt_FloatTensor:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)";
}

//===----------------------------------------------------------------------===//
// Shape ops
//===----------------------------------------------------------------------===//

def DLOpt_ReshapeOp : DLOpt_Op<"reshape", [Pure, SameOperandsAndResultElementType, Differentiable]> {
  let summary = "row-major reshape to a type with the same element count";
  let description = [{
    ```mlir
    %y = dlopt.reshape %x : tensor<4x8xf32> -> tensor<32xf32>
    ```
  }];
  let arguments = (ins DLOpt_AnyTensor:$input);
  let results = (outs DLOpt_AnyTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
  let hasFolder = 1;
}

def DLOpt_TransposeOp : DLOpt_Op<"transpose", [Pure, InferTypeOpAdaptor, Differentiable]> {
  let summary = "permutes dims: result.shape[i] = input.shape[perm[i]]";
  let description = [{
    ```mlir
    %y = dlopt.transpose %x perm = [0, 2, 1] : tensor<2x4x8xf32> -> tensor<2x8x4xf32>
    ```
  }];
  let arguments = (ins DLOpt_AnyTensor:$input, DenseI64ArrayAttr:$perm);
  let results = (outs DLOpt_AnyTensor:$result);
  let assemblyFormat = "$input `perm` `=` $perm attr-dict `:` type($input) `->` type($result)";
  let hasFolder = 1;
}

def DLOpt_BroadcastToOp : DLOpt_Op<"broadcast_to", [Pure, SameOperandsAndResultElementType, Differentiable]> {
  let summary = "broadcasts to a larger shape by NumPy rules";
  let description = [{
    ```mlir
    %y = dlopt.broadcast_to %x : tensor<1x8xf32> -> tensor<4x8xf32>
    ```
  }];
  let arguments = (ins DLOpt_AnyTensor:$input);
  let results = (outs DLOpt_AnyTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
  let hasFolder = 1;
}

def DLOpt_ConcatOp : DLOpt_Op<"concat", [Pure, InferTypeOpAdaptor, Differentiable]> {
  let summary = "concatenates tensors along one dim";
  let description = [{
    Operands have the same rank and element type and equal sizes except along `dim`.

    ```mlir
    %y = dlopt.concat %a, %b dim = 0 : tensor<2x8xf32>, tensor<3x8xf32> -> tensor<5x8xf32>
    ```
  }];
  let arguments = (ins Variadic<DLOpt_AnyTensor>:$inputs, DLOpt_I64Attr:$dim);
  let results = (outs DLOpt_AnyTensor:$result);
  let assemblyFormat = "$inputs `dim` `=` $dim attr-dict `:` type($inputs) `->` type($result)";
  let hasFolder = 1;
}

def DLOpt_SliceOp : DLOpt_Op<"slice", [Pure, InferTypeOpAdaptor, Differentiable]> {
  let summary = "static strided slice";
  let description = [{
    Per dim `0 <= start <= limit <= size` and `stride >= 1`; the result size
    is `ceil((limit - start) / stride)`.

    ```mlir
    %y = dlopt.slice %x start = [0, 1] limit = [4, 8] stride = [1, 2] : tensor<4x8xf32> -> tensor<4x4xf32>
    ```
  }];
  let arguments = (ins DLOpt_AnyTensor:$input, DenseI64ArrayAttr:$start,
                       DenseI64ArrayAttr:$limit, DenseI64ArrayAttr:$stride);
  let results = (outs DLOpt_AnyTensor:$result);
  let assemblyFormat = "$input `start` `=` $start `limit` `=` $limit `stride` `=` $stride attr-dict `:` type($input) `->` type($result)";
  let hasFolder = 1;
}

def DLOpt_GatherOp : DLOpt_Op<"gather", [Pure, InferTypeOpAdaptor, Differentiable]> {
  let summary = "gathers rows of a table by integer ids (embedding lookup)";
  let description = [{
    `table` is `[V, rest...]`; the result is `ids.shape ++ rest`. Ids outside
    `[0, V)` are a runtime error.

    ```mlir
    %e = dlopt.gather %table, %ids : tensor<100x16xf32>, tensor<2x5xi32> -> tensor<2x5x16xf32>
    ```
  }];
  let arguments = (ins DLOpt_AnyTensor:$table, DLOpt_IntTensor:$ids);
  let results = (outs DLOpt_AnyTensor:$result);
  let assemblyFormat = "$table `,` $ids attr-dict `:` type($table) `,` type($ids) `->` type($result)";
}

def DLOpt_IotaOp : DLOpt_Op<"iota", [Pure]> {
  let summary = "indices along one dim: y[idx] = idx[dim]";
  let description = [{
    ```mlir
    %pos = dlopt.iota dim = 0 : tensor<16xi32>
    ```
  }];
  let arguments = (ins DLOpt_I64Attr:$dim);
  let results = (outs DLOpt_NumTensor:$result);
  let assemblyFormat = "`dim` `=` $dim attr-dict `:` type($result)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// NN ops
//===----------------------------------------------------------------------===//

class DLOpt_SoftmaxLikeOp<string mnemonic, string formula>
    : DLOpt_Op<mnemonic, [Pure, SameOperandsAndResultType, Differentiable]> {
  let summary = formula # " along one dim";
  let description = "Numerically stable `" # formula # "` along `dim`, "
      # "computed in f32.\n\n```mlir\n%y = dlopt." # mnemonic
      # " %x dim = 1 : tensor<4x8xf32>\n```";
  let arguments = (ins DLOpt_FloatTensor:$input, DLOpt_I64Attr:$dim);
  let results = (outs DLOpt_FloatTensor:$result);
  let assemblyFormat = "$input `dim` `=` $dim attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def DLOpt_SoftmaxOp : DLOpt_SoftmaxLikeOp<"softmax", "softmax">;
def DLOpt_LogSoftmaxOp : DLOpt_SoftmaxLikeOp<"log_softmax", "log(softmax)">;

def DLOpt_LayerNormOp : DLOpt_Op<"layer_norm",
    [Pure, AttrSizedOperandSegments, AllTypesMatch<["input", "result"]>, Differentiable]> {
  let summary = "layer normalization over the trailing dims from `axis`";
  let description = [{
    `y = (x - mean) / sqrt(var + eps) * weight + bias` with mean and biased
    variance over dims `[axis, rank)` (default: the last dim). `weight` and
    `bias` are optional and shaped `x.shape[axis:]`.

    ```mlir
    %y = dlopt.layer_norm %x weight(%w) bias(%b) {eps = 1.0e-05 : f64}
        : (tensor<2x4x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
    ```
  }];
  let arguments = (ins DLOpt_FloatTensor:$input, Optional<DLOpt_FloatTensor>:$weight,
                       Optional<DLOpt_FloatTensor>:$bias,
                       DefaultValuedAttr<DLOpt_I64Attr, "-1">:$axis,
                       DefaultValuedAttr<F64Attr, "1.0e-5">:$eps);
  let results = (outs DLOpt_FloatTensor:$result);
  let assemblyFormat = "$input (`weight` `(` $weight^ `)`)? (`bias` `(` $bias^ `)`)? attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def DLOpt_RMSNormOp : DLOpt_Op<"rms_norm", [Pure, AllTypesMatch<["input", "result"]>, Differentiable]> {
  let summary = "RMS normalization over the trailing dims from `axis`";
  let description = [{
    `y = x / sqrt(mean(x^2) + eps) * weight` over dims `[axis, rank)`
    (default: the last dim); `weight` is optional, shaped `x.shape[axis:]`.

    ```mlir
    %y = dlopt.rms_norm %x weight(%w) {eps = 1.0e-06 : f64}
        : (tensor<2x4x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
    ```
  }];
  let arguments = (ins DLOpt_FloatTensor:$input, Optional<DLOpt_FloatTensor>:$weight,
                       DefaultValuedAttr<DLOpt_I64Attr, "-1">:$axis,
                       DefaultValuedAttr<F64Attr, "1.0e-6">:$eps);
  let results = (outs DLOpt_FloatTensor:$result);
  let assemblyFormat = "$input (`weight` `(` $weight^ `)`)? attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def DLOpt_AttentionOp : DLOpt_Op<"attention", [Pure, InferTypeOpAdaptor, Differentiable]> {
  let summary = "scaled dot-product attention, optionally causal, with grouped kv heads";
  let description = [{
    `softmax(scale * q k^T + mask) v` with `q: [B, H, S, D]`,
    `k: [B, G, T, D]`, `v: [B, G, T, E]`, `H % G == 0` (query head `h` reads
    kv head `h / (H / G)`). `scale` defaults to `1/sqrt(D)`. With `causal`,
    query `i` sees keys `j <= i + (T - S)`, or `j <= i + o` with the optional
    `offset` operand `o` (a rank-0 integer tensor: the position of query 0
    among the keys, as when a rank of a context-parallel step attends with
    its block of queries to every key). The result is `[B, H, S, E]`.

    ```mlir
    %o = dlopt.attention %q, %k, %v {causal} : tensor<2x4x16x8xf32>,
        tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32> -> tensor<2x4x16x8xf32>
    ```
  }];
  let arguments = (ins DLOpt_FloatTensor:$query, DLOpt_FloatTensor:$key,
                       DLOpt_FloatTensor:$value,
                       Optional<DLOpt_IntTensor>:$query_offset, UnitAttr:$causal,
                       OptionalAttr<F64Attr>:$scale);
  let results = (outs DLOpt_FloatTensor:$result);
  let assemblyFormat = "$query `,` $key `,` $value (`offset` `(` $query_offset^ `:` type($query_offset) `)`)? attr-dict `:` type($query) `,` type($key) `,` type($value) `->` type($result)";
}

def DLOpt_RopeOp : DLOpt_Op<"rope", [Pure, AllTypesMatch<["input", "result"]>, Differentiable]> {
  let summary = "rotary position embedding over the last dim, positions along dim -2";
  let description = [{
    Half-split rotation: for `i < D/2`, angle `p * theta^(-2i/D)` rotates the
    pair `(x[i], x[i + D/2])`, where `p` is the index along dim -2 plus the
    optional `offset` operand (a rank-0 integer tensor: the position of the
    first row, as in a context-parallel rank's block of the sequence). With
    `inverse` the rotation is by the negated angle (the gradient of rope).

    ```mlir
    %y = dlopt.rope %x {theta = 1.0e+04 : f64} : tensor<2x4x16x8xf32>
    ```
  }];
  let arguments = (ins DLOpt_FloatTensor:$input, Optional<DLOpt_IntTensor>:$offset,
                       DefaultValuedAttr<F64Attr, "10000.0">:$theta,
                       UnitAttr:$inverse);
  let results = (outs DLOpt_FloatTensor:$result);
  let assemblyFormat = "$input (`offset` `(` $offset^ `:` type($offset) `)`)? attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def DLOpt_Conv2DOp : DLOpt_Op<"conv2d", [Pure, InferTypeOpAdaptor, Differentiable]> {
  let summary = "2-D convolution, NCHW input and OIHW filter";
  let description = [{
    `x: [N, C, H, W]`, `w: [O, C/groups, KH, KW]`, optional `bias: [O]`.
    Zero padding `padding[i]` on both sides; output size
    `(H + 2p - d(K-1) - 1) / s + 1`.

    ```mlir
    %y = dlopt.conv2d %x, %w {padding = array<i64: 1, 1>}
        : (tensor<1x3x8x8xf32>, tensor<4x3x3x3xf32>) -> tensor<1x4x8x8xf32>
    ```
  }];
  let arguments = (ins DLOpt_FloatTensor:$input, DLOpt_FloatTensor:$filter,
                       Optional<DLOpt_FloatTensor>:$bias,
                       DefaultValuedAttr<DenseI64ArrayAttr, "{1, 1}">:$stride,
                       DefaultValuedAttr<DenseI64ArrayAttr, "{0, 0}">:$padding,
                       DefaultValuedAttr<DenseI64ArrayAttr, "{1, 1}">:$dilation,
                       DefaultValuedAttr<DLOpt_I64Attr, "1">:$groups);
  let results = (outs DLOpt_FloatTensor:$result);
  let assemblyFormat = "$input `,` $filter (`bias` `(` $bias^ `)`)? attr-dict `:` functional-type(operands, results)";
}

class DLOpt_PoolOp<string mnemonic, string what, dag extraArgs = (ins)>
    : DLOpt_Op<mnemonic, [Pure, InferTypeOpAdaptor, Differentiable]> {
  let summary = "2-D " # what # " pooling over NCHW";
  let description = "Pools `kernel` windows with `stride` (default: the "
      # "kernel) and `padding` on both sides.\n\n```mlir\n%y = dlopt." # mnemonic
      # " %x {kernel = array<i64: 2, 2>} : tensor<1x4x8x8xf32> -> tensor<1x4x4x4xf32>\n```";
  let arguments = !con((ins DLOpt_FloatTensor:$input, DenseI64ArrayAttr:$kernel,
                       OptionalAttr<DenseI64ArrayAttr>:$stride,
                       DefaultValuedAttr<DenseI64ArrayAttr, "{0, 0}">:$padding), extraArgs);
  let results = (outs DLOpt_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
}

def DLOpt_MaxPool2DOp : DLOpt_PoolOp<"max_pool2d", "max">;
def DLOpt_AvgPool2DOp : DLOpt_PoolOp<"avg_pool2d", "average",
    (ins DefaultValuedAttr<BoolAttr, "true">:$count_include_pad)>;

def DLOpt_BatchNormOp : DLOpt_Op<"batch_norm", [Pure, InferTypeOpAdaptor, Differentiable]> {
  let summary = "batch normalization with training and inference semantics";
  let description = [{
    `x: [N, C, ...]`; `weight`, `bias`, `running_mean`, `running_var`: `[C]`.
    With `training`, normalizes with the batch statistics (biased variance)
    and returns updated running statistics (momentum `m`, unbiased variance);
    otherwise normalizes with the running statistics and returns them unchanged.

    ```mlir
    %y, %m2, %v2 = dlopt.batch_norm %x, %w, %b, %m, %v {training}
        : (tensor<8x4x6x6xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>)
        -> (tensor<8x4x6x6xf32>, tensor<4xf32>, tensor<4xf32>)
    ```
  }];
  let arguments = (ins DLOpt_FloatTensor:$input, DLOpt_FloatTensor:$weight,
                       DLOpt_FloatTensor:$bias, DLOpt_FloatTensor:$running_mean,
                       DLOpt_FloatTensor:$running_var,
                       DefaultValuedAttr<F64Attr, "1.0e-5">:$eps,
                       DefaultValuedAttr<F64Attr, "0.1">:$momentum,
                       UnitAttr:$training);
  let results = (outs DLOpt_FloatTensor:$result, DLOpt_FloatTensor:$new_running_mean,
                      DLOpt_FloatTensor:$new_running_var);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
}

def DLOpt_DropoutOp : DLOpt_Op<"dropout", [Pure, AllTypesMatch<["input", "result"]>,
                                          Differentiable]> {
  let summary = "dropout with an explicit seed (deterministic on every backend)";
  let description = [{
    Element `i` is kept iff `u(s, i) >= rate` (the counter-based uniform in
    docs/ops.md) and then scaled by `1/(1-rate)`. The effective seed is
    `s = seed + offset * 0xD1B54A32D192ED03` (uint64, wrapping; the offset
    sign-extended to 64 bits). The optional `offset` operand is a rank-0
    i32/i64 tensor (dlopt-optimizer sets it to the training step so that each
    step draws a new mask); without it the offset is 0.

    ```mlir
    %y = dlopt.dropout %x {rate = 1.0e-01 : f64, seed = 42 : i64} : tensor<4x8xf32>
    %z = dlopt.dropout %x offset(%step : tensor<i64>) {rate = 1.0e-01 : f64, seed = 42 : i64} : tensor<4x8xf32>
    ```
  }];
  let arguments = (ins DLOpt_FloatTensor:$input, Optional<DLOpt_IntTensor>:$offset,
                       F64Attr:$rate, DLOpt_I64Attr:$seed);
  let results = (outs DLOpt_FloatTensor:$result);
  let assemblyFormat = [{
    $input (`offset` `(` $offset^ `:` type($offset) `)`)? attr-dict `:` type($result)
  }];
  let hasVerifier = 1;
  let hasFolder = 1;
}

//===----------------------------------------------------------------------===//
// Losses
//===----------------------------------------------------------------------===//

def DLOpt_CrossEntropyOp : DLOpt_Op<"cross_entropy", [Pure, InferTypeOpAdaptor, Differentiable]> {
  let summary = "mean softmax cross-entropy of logits [N, C] against integer labels [N]";
  let description = [{
    Mean over rows whose label is not `ignore_index` (default -100) of
    `logsumexp(logits[i]) - logits[i, label[i]]`; 0 when every row is ignored.
    The result has the logits' element type, or f32 (bf16/f16 logits are
    read as f32 and the loss is computed in f32/f64 either way, so an f32
    loss from bf16 logits equals the loss of the logits cast to f32).

    ```mlir
    %l = dlopt.cross_entropy %logits, %labels : tensor<8x10xf32>, tensor<8xi32> -> tensor<f32>
    %m = dlopt.cross_entropy %h, %labels : tensor<8x10xbf16>, tensor<8xi32> -> tensor<f32>
    ```
  }];
  let arguments = (ins DLOpt_FloatTensor:$logits, DLOpt_IntTensor:$labels,
                       DefaultValuedAttr<DLOpt_I64Attr, "-100">:$ignore_index);
  let results = (outs DLOpt_FloatScalar:$result);
  let assemblyFormat = "$logits `,` $labels attr-dict `:` type($logits) `,` type($labels) `->` type($result)";
  let extraClassDeclaration = [{
    /// The inferred result (the logits' element type) or an f32 scalar.
    static bool isCompatibleReturnTypes(::mlir::TypeRange inferred,
                                        ::mlir::TypeRange actual);
  }];
}

def DLOpt_MSEOp : DLOpt_Op<"mse", [Pure, InferTypeOpAdaptor, Differentiable]> {
  let summary = "mean squared error of two same-shaped tensors";
  let description = [{
    ```mlir
    %l = dlopt.mse %a, %b : tensor<8x4xf32>, tensor<8x4xf32> -> tensor<f32>
    ```
  }];
  let arguments = (ins DLOpt_FloatTensor:$lhs, DLOpt_FloatTensor:$rhs);
  let results = (outs DLOpt_FloatScalar:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)";
}

//===----------------------------------------------------------------------===//
// Gradient ops: the backward counterparts that dlopt-autodiff emits where a
// composition of primitive ops would be slow or imprecise.
//===----------------------------------------------------------------------===//

def DLOpt_ScatterAddOp : DLOpt_Op<"scatter_add", [Pure]> {
  let summary = "sums rows of updates into a zero table at integer ids (gather's gradient)";
  let description = [{
    `result[ids[i], ...] += updates[i, ...]` over a zero-initialized result of
    shape `[V, rest...]`; `updates` has shape `ids.shape ++ rest`.

    ```mlir
    %g = dlopt.scatter_add %ids, %dy : tensor<2x5xi32>, tensor<2x5x16xf32> -> tensor<100x16xf32>
    ```
  }];
  let arguments = (ins DLOpt_IntTensor:$ids, DLOpt_FloatTensor:$updates);
  let results = (outs DLOpt_FloatTensor:$result);
  let assemblyFormat = "$ids `,` $updates attr-dict `:` type($ids) `,` type($updates) `->` type($result)";
  let hasVerifier = 1;
}

class DLOpt_SoftmaxGradLikeOp<string mnemonic, string formula>
    : DLOpt_Op<mnemonic, [Pure, SameOperandsAndResultType]> {
  let summary = "gradient of " # formula # " from its output and the output gradient";
  let description = "Given `y` (the forward output) and `dy`, computes the input "
      # "gradient along `dim`. See docs/ops.md.\n\n```mlir\n%dx = dlopt." # mnemonic
      # " %y, %dy dim = 1 : tensor<4x8xf32>\n```";
  let arguments = (ins DLOpt_FloatTensor:$output, DLOpt_FloatTensor:$grad, DLOpt_I64Attr:$dim);
  let results = (outs DLOpt_FloatTensor:$result);
  let assemblyFormat = "$output `,` $grad `dim` `=` $dim attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def DLOpt_SoftmaxGradOp : DLOpt_SoftmaxGradLikeOp<"softmax_grad", "softmax">;
def DLOpt_LogSoftmaxGradOp : DLOpt_SoftmaxGradLikeOp<"log_softmax_grad", "log_softmax">;

def DLOpt_LayerNormGradOp : DLOpt_Op<"layer_norm_grad", [Pure]> {
  let summary = "gradients of layer_norm: input, weight and bias";
  let description = [{
    Recomputes the statistics of `input` over dims `[axis, rank)` and returns
    `(d input, d weight, d bias)`; the last two are shaped `input.shape[axis:]`
    (computed as if weight were ones when it is absent).

    ```mlir
    %dx, %dw, %db = dlopt.layer_norm_grad %x, %dy weight(%w) {eps = 1.0e-05 : f64}
        : (tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<8xf32>) -> (tensor<2x4x8xf32>, tensor<8xf32>, tensor<8xf32>)
    ```
  }];
  let arguments = (ins DLOpt_FloatTensor:$input, DLOpt_FloatTensor:$grad,
                       Optional<DLOpt_FloatTensor>:$weight,
                       DefaultValuedAttr<DLOpt_I64Attr, "-1">:$axis,
                       DefaultValuedAttr<F64Attr, "1.0e-5">:$eps);
  let results = (outs DLOpt_FloatTensor:$input_grad, DLOpt_FloatTensor:$weight_grad,
                      DLOpt_FloatTensor:$bias_grad);
  let assemblyFormat = "$input `,` $grad (`weight` `(` $weight^ `)`)? attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def DLOpt_RMSNormGradOp : DLOpt_Op<"rms_norm_grad", [Pure]> {
  let summary = "gradients of rms_norm: input and weight";
  let description = [{
    ```mlir
    %dx, %dw = dlopt.rms_norm_grad %x, %dy weight(%w)
        : (tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<8xf32>) -> (tensor<2x4x8xf32>, tensor<8xf32>)
    ```
  }];
  let arguments = (ins DLOpt_FloatTensor:$input, DLOpt_FloatTensor:$grad,
                       Optional<DLOpt_FloatTensor>:$weight,
                       DefaultValuedAttr<DLOpt_I64Attr, "-1">:$axis,
                       DefaultValuedAttr<F64Attr, "1.0e-6">:$eps);
  let results = (outs DLOpt_FloatTensor:$input_grad, DLOpt_FloatTensor:$weight_grad);
  let assemblyFormat = "$input `,` $grad (`weight` `(` $weight^ `)`)? attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def DLOpt_AttentionGradOp : DLOpt_Op<"attention_grad", [Pure]> {
  let summary = "gradients of attention for query, key and value";
  let description = [{
    Recomputes the attention probabilities from `q`, `k` (with the same
    `causal` and `scale`) and returns `(dq, dk, dv)` for the output gradient
    `dout`. With grouped kv heads, dk and dv sum over the query heads of a group.

    ```mlir
    %dq, %dk, %dv = dlopt.attention_grad %q, %k, %v, %do {causal, scale = 0.125 : f64}
        : (tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>)
        -> (tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>)
    ```
  }];
  let arguments = (ins DLOpt_FloatTensor:$query, DLOpt_FloatTensor:$key,
                       DLOpt_FloatTensor:$value, DLOpt_FloatTensor:$grad,
                       Optional<DLOpt_IntTensor>:$query_offset,
                       UnitAttr:$causal, OptionalAttr<F64Attr>:$scale);
  let results = (outs DLOpt_FloatTensor:$query_grad, DLOpt_FloatTensor:$key_grad,
                      DLOpt_FloatTensor:$value_grad);
  let assemblyFormat = "$query `,` $key `,` $value `,` $grad (`offset` `(` $query_offset^ `)`)? attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

class DLOpt_ConvGradOp<string mnemonic, string what, string first, string second>
    : DLOpt_Op<mnemonic, [Pure]> {
  let summary = "gradient of conv2d with respect to its " # what;
  let description = "Operands: the " # first # " and the " # second # ". Same "
      # "attributes as `dlopt.conv2d`; the result type is "
      # "given and checked by running conv2d's shape rule forward.\n\n```mlir\n"
      # "%d = dlopt." # mnemonic # " %a, %b {padding = array<i64: 1, 1>} : "
      # "(tensor<..>, tensor<..>) -> tensor<..>\n```";
  let arguments = (ins DLOpt_FloatTensor:$lhs, DLOpt_FloatTensor:$rhs,
                       DefaultValuedAttr<DenseI64ArrayAttr, "{1, 1}">:$stride,
                       DefaultValuedAttr<DenseI64ArrayAttr, "{0, 0}">:$padding,
                       DefaultValuedAttr<DenseI64ArrayAttr, "{1, 1}">:$dilation,
                       DefaultValuedAttr<DLOpt_I64Attr, "1">:$groups);
  let results = (outs DLOpt_FloatTensor:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

/// Operands: the output gradient [N, O, OH, OW] and the filter.
def DLOpt_Conv2DGradInputOp : DLOpt_ConvGradOp<"conv2d_grad_input", "input",
    "output gradient [N, O, OH, OW]", "filter">;
/// Operands: the forward input [N, C, H, W] and the output gradient.
def DLOpt_Conv2DGradFilterOp : DLOpt_ConvGradOp<"conv2d_grad_filter", "filter",
    "forward input [N, C, H, W]", "output gradient">;

def DLOpt_MaxPool2DGradOp : DLOpt_Op<"max_pool2d_grad", [Pure, AllTypesMatch<["input", "result"]>]> {
  let summary = "gradient of max_pool2d: each window's gradient goes to its first maximum";
  let description = [{
    ```mlir
    %dx = dlopt.max_pool2d_grad %x, %dy {kernel = array<i64: 2, 2>}
        : (tensor<1x4x8x8xf32>, tensor<1x4x4x4xf32>) -> tensor<1x4x8x8xf32>
    ```
  }];
  let arguments = (ins DLOpt_FloatTensor:$input, DLOpt_FloatTensor:$grad,
                       DenseI64ArrayAttr:$kernel, OptionalAttr<DenseI64ArrayAttr>:$stride,
                       DefaultValuedAttr<DenseI64ArrayAttr, "{0, 0}">:$padding);
  let results = (outs DLOpt_FloatTensor:$result);
  let assemblyFormat = "$input `,` $grad attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def DLOpt_AvgPool2DGradOp : DLOpt_Op<"avg_pool2d_grad", [Pure]> {
  let summary = "gradient of avg_pool2d";
  let description = [{
    ```mlir
    %dx = dlopt.avg_pool2d_grad %dy {kernel = array<i64: 2, 2>} : tensor<1x4x4x4xf32> -> tensor<1x4x8x8xf32>
    ```
  }];
  let arguments = (ins DLOpt_FloatTensor:$grad, DenseI64ArrayAttr:$kernel,
                       OptionalAttr<DenseI64ArrayAttr>:$stride,
                       DefaultValuedAttr<DenseI64ArrayAttr, "{0, 0}">:$padding,
                       DefaultValuedAttr<BoolAttr, "true">:$count_include_pad);
  let results = (outs DLOpt_FloatTensor:$result);
  let assemblyFormat = "$grad attr-dict `:` type($grad) `->` type($result)";
  let hasVerifier = 1;
}

def DLOpt_BatchNormGradOp : DLOpt_Op<"batch_norm_grad", [Pure]> {
  let summary = "gradients of batch_norm: input, weight and bias";
  let description = [{
    With `training`, recomputes the batch statistics of `input` (the running
    statistics operands are then unused); otherwise uses them.

    ```mlir
    %dx, %dw, %db = dlopt.batch_norm_grad %x, %w, %m, %v, %dy {training}
        : (tensor<8x4x6x6xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<8x4x6x6xf32>)
        -> (tensor<8x4x6x6xf32>, tensor<4xf32>, tensor<4xf32>)
    ```
  }];
  let arguments = (ins DLOpt_FloatTensor:$input, DLOpt_FloatTensor:$weight,
                       DLOpt_FloatTensor:$running_mean, DLOpt_FloatTensor:$running_var,
                       DLOpt_FloatTensor:$grad,
                       DefaultValuedAttr<F64Attr, "1.0e-5">:$eps, UnitAttr:$training);
  let results = (outs DLOpt_FloatTensor:$input_grad, DLOpt_FloatTensor:$weight_grad,
                      DLOpt_FloatTensor:$bias_grad);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def DLOpt_CrossEntropyGradOp : DLOpt_Op<"cross_entropy_grad", [Pure]> {
  let summary = "gradient of cross_entropy with respect to the logits";
  let description = [{
    `(softmax(logits[i]) - onehot(label[i])) * dloss / count` for rows whose
    label is not `ignore_index`, 0 for ignored rows; `count` is the number of
    rows not ignored. `dloss` has the logits' element type or f32; the
    result has the logits' type (computed in f32, rounded once).

    ```mlir
    %dl = dlopt.cross_entropy_grad %logits, %labels, %dloss
        : (tensor<8x10xf32>, tensor<8xi32>, tensor<f32>) -> tensor<8x10xf32>
    ```
  }];
  let arguments = (ins DLOpt_FloatTensor:$logits, DLOpt_IntTensor:$labels,
                       DLOpt_FloatScalar:$grad,
                       DefaultValuedAttr<DLOpt_I64Attr, "-100">:$ignore_index);
  let results = (outs DLOpt_FloatTensor:$result);
  let assemblyFormat = "$logits `,` $labels `,` $grad attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def DLOpt_GeluGradOp : DLOpt_Op<"gelu_grad", [Pure, SameOperandsAndResultType]> {
  let summary = "gradient of gelu: dy * gelu'(x)";
  let description = [{
    ```mlir
    %dx = dlopt.gelu_grad %x, %dy {approximate = "tanh"} : tensor<4x8xf32>
    ```
  }];
  let arguments = (ins DLOpt_FloatTensor:$input, DLOpt_FloatTensor:$grad,
                       DefaultValuedStrAttr<StrAttr, "none">:$approximate);
  let results = (outs DLOpt_FloatTensor:$result);
  let assemblyFormat = "$input `,` $grad attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def DLOpt_SliceGradOp : DLOpt_Op<"slice_grad", [Pure, SameOperandsAndResultElementType]> {
  let summary = "places a slice's gradient into zeros of the sliced tensor's shape";
  let description = [{
    The adjoint of `dlopt.slice` with the same `start`, `limit` and `stride`.

    ```mlir
    %dx = dlopt.slice_grad %dy start = [0, 1] limit = [4, 8] stride = [1, 2] : tensor<4x4xf32> -> tensor<4x8xf32>
    ```
  }];
  let arguments = (ins DLOpt_FloatTensor:$grad, DenseI64ArrayAttr:$start,
                       DenseI64ArrayAttr:$limit, DenseI64ArrayAttr:$stride);
  let results = (outs DLOpt_FloatTensor:$result);
  let assemblyFormat = "$grad `start` `=` $start `limit` `=` $limit `stride` `=` $stride attr-dict `:` type($grad) `->` type($result)";
  let hasVerifier = 1;
}


//===----------------------------------------------------------------------===//
// Point-to-point communication (pipeline stages, dlopt-pipeline)
//===----------------------------------------------------------------------===//

def DLOpt_SendRecvOp : DLOpt_Op<"send_recv", []> {
  let summary = "point-to-point sends and receives posted together";
  let description = [{
    Sends each of `inputs` to the rank at coordinate `to[i]` on mesh axis
    `axis` (the other coordinates equal), and receives each result from the
    rank at coordinate `from[j]`. The transfers of one op are posted together
    and the op completes when all have (NCCL's grouped p2p), so two stages
    that exchange tensors in one op each cannot wait for each other. The
    k-th tensor one rank sends another is the k-th that rank receives from
    it. `dlopt-pipeline` emits these between the per-stage functions of a
    pipelined step; the executable's load-time check proves that the sends
    and receives pair up and cannot deadlock.

    ```mlir
    %g = dlopt.send_recv %act to [1] from [1] over "pp" : (tensor<4x16x64xf32>) -> tensor<4x16x64xf32>
    dlopt.send_recv %loss to [0] from [] over "pp" : (tensor<f32>) -> ()
    ```
  }];
  let arguments = (ins Variadic<DLOpt_AnyTensor>:$inputs,
                       DenseI64ArrayAttr:$to, DenseI64ArrayAttr:$from,
                       StrAttr:$axis);
  let results = (outs Variadic<DLOpt_AnyTensor>:$results);
  let assemblyFormat = [{
    ($inputs^)? `to` $to `from` $from `over` $axis attr-dict `:` functional-type($inputs, $results)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Fused elementwise groups (dlopt-fuse-elementwise)
//===----------------------------------------------------------------------===//

def DLOpt_FusedElementwiseOp : DLOpt_Op<"fused_elementwise",
    [IsolatedFromAbove, SingleBlock, RecursiveMemoryEffects]> {
  let summary = "a group of elementwise ops run as one kernel";
  let description = [{
    Holds a chain of elementwise ops over one shape (the shape of every
    result, the *fused shape*) that `dlopt-fuse-elementwise` outlined. Each
    input has the fused shape or is a rank-0 tensor broadcast to it. The body
    is a single block whose arguments are the inputs; it holds rank-0 float
    `arith.constant`s and the fusible float ops (`neg abs relu exp log sqrt
    rsqrt tanh sin cos sigmoid silu gelu cast add sub mul div maximum minimum
    pow`, `compare` of floats, `select` of floats), each with a result of the
    fused shape, and ends in `dlopt.yield`. The i1 results of `compare` are
    read only by the body's `select`s: inputs and results are float tensors.
    Every value a later op outside the group uses is a result.

    Backends evaluate the body per element in f32 and round only the results
    to their element type (an explicit `dlopt.cast` inside still rounds); see
    docs/ops.md ("Fused elementwise groups").

    Multi-tensor form (`segments = N`, N > 1, made by
    `dlopt-merge-fused-elementwise`): the op runs the one body over N
    independent tensor *segments*. Inputs and results are segment-major:
    segment s owns inputs [s*K, (s+1)*K) and results [s*R, (s+1)*R), with
    K = #inputs / N body arguments and R = #results / N yielded values. Each
    segment has its own fused shape (the shape of its first result); input k
    of every segment has the element type of body argument k and is rank 0
    exactly when that argument is, and result j of every segment has the
    element type of yielded value j. The body is written over segment 0's
    shape. Absent `segments` means one segment.

    ```mlir
    %r:2 = dlopt.fused_elementwise(%a, %s, %b, %s) attributes {segments = 2 : i64} : (tensor<8xf32>, tensor<f32>, tensor<3x5xf32>, tensor<f32>) -> (tensor<8xf32>, tensor<3x5xf32>) {
    ^bb0(%x: tensor<8xf32>, %k: tensor<f32>):
      %0 = dlopt.mul %x, %k : tensor<8xf32>, tensor<f32> -> tensor<8xf32>
      dlopt.yield %0 : tensor<8xf32>
    }
    ```

    ```mlir
    %r:2 = dlopt.fused_elementwise(%m, %g, %lr) : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<f32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
    ^bb0(%a: tensor<4x8xf32>, %b: tensor<4x8xf32>, %s: tensor<f32>):
      %c = arith.constant dense<0.9> : tensor<f32>
      %0 = dlopt.mul %a, %c : tensor<4x8xf32>, tensor<f32> -> tensor<4x8xf32>
      %1 = dlopt.add %0, %b : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
      %2 = dlopt.mul %1, %s : tensor<4x8xf32>, tensor<f32> -> tensor<4x8xf32>
      dlopt.yield %1, %2 : tensor<4x8xf32>, tensor<4x8xf32>
    }
    ```
  }];
  let arguments = (ins Variadic<DLOpt_FloatTensor>:$inputs,
                       OptionalAttr<ConfinedAttr<I64Attr, [IntMinValue<1>]>>:$segments);
  let results = (outs Variadic<DLOpt_FloatTensor>:$results);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    `(` $inputs `)` attr-dict-with-keyword `:` functional-type($inputs, $results) $body
  }];
  let hasVerifier = 1;
  let hasRegionVerifier = 1;
  let extraClassDeclaration = [{
    /// The shape every result has (the shape of the first result).
    ::llvm::ArrayRef<int64_t> getFusedShape() {
      return ::llvm::cast<::mlir::RankedTensorType>(getResult(0).getType()).getShape();
    }
    /// The number of tensor segments (1 unless multi-tensor).
    int64_t getNumSegments() {
      return static_cast<int64_t>(getSegments().value_or(1));
    }
    /// Inputs and results of one segment (segment-major order).
    ::mlir::OperandRange getSegmentInputs(int64_t s) {
      int64_t k = getInputs().size() / getNumSegments();
      return getInputs().slice(s * k, k);
    }
    ::mlir::ResultRange getSegmentResults(int64_t s) {
      int64_t r = getNumResults() / getNumSegments();
      return getResults().slice(s * r, r);
    }
    /// Whether `op` may appear in the body of a fused group (its kind and
    /// element types; shapes are checked against the group).
    static bool isFusible(::mlir::Operation *op);
  }];
}

def DLOpt_YieldOp : DLOpt_Op<"yield",
    [Pure, Terminator, HasParent<"FusedElementwiseOp">]> {
  let summary = "returns the results of a dlopt.fused_elementwise body";
  let description = [{
    ```mlir
    dlopt.yield %1, %2 : tensor<4x8xf32>, tensor<4x8xf32>
    ```
  }];
  let arguments = (ins Variadic<AnyType>:$values);
  let assemblyFormat = "attr-dict ($values^ `:` type($values))?";
}

#endif // DLOPT_OPS_TD
