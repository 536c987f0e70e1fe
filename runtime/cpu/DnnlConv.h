//===- DnnlConv.h - conv2d and its gradients through oneDNN ---------------===//
//
// When dlopt is built with oneDNN (Debian's libdnnl-dev; DLOPT_HAVE_DNNL),
// the CPU backend's conv2d, conv2d_grad_input and conv2d_grad_filter run
// oneDNN's direct convolutions (its JIT kernels for the machine's ISA, the
// ones PyTorch calls on CPUs) instead of im2col + sgemm (Conv.cpp), which
// stays as the fallback and as the reference the tests compare with.
//
// Determinism: the batch is cut into chunks of images fixed by the shape
// alone, and each chunk runs single-threaded on one worker of the kernel
// pool (oneDNN's OpenMP team is one thread there, and every primitive is
// created for one thread), so results do not depend on the thread count or
// the process layout. The filter gradient sums its chunks' partial
// gradients in chunk order.
//
// DLOPT_CONV=im2col in the environment (or setConvPath) turns it off.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "runtime/format/OpTable.h"

#include <cstdint>

namespace dlopt::rt::cpu {

enum class ConvPath {
  Auto,   ///< oneDNN where built with it and it takes the shape
  Im2col, ///< always im2col + sgemm
};

/// Overrides DLOPT_CONV for this process (tests compare both paths).
void setConvPath(ConvPath path);
/// The path in effect: setConvPath's, else DLOPT_CONV's, else Auto.
ConvPath convPath();
/// Whether this build has oneDNN.
bool haveDnnl();
/// "onednn <version> (<isa>)" or "im2col + sgemm", for reports.
const char *convImplementationName();

/// y [n, o, oh, ow] = conv(x [n, c, h, w], w [o, c/groups, kh, kw]), f32
/// NCHW. False when oneDNN is not used for this call (not built, turned
/// off, or it has no implementation for the shape): the caller falls back.
bool dnnlConvForward(const ConvGeom &g, int64_t n, int64_t c, int64_t o,
                     const float *x, const float *w, float *y);
/// dx = the input gradient of dy through w (overwritten, not accumulated).
bool dnnlConvBackwardData(const ConvGeom &g, int64_t n, int64_t c, int64_t o,
                          const float *dy, const float *w, float *dx);
/// dw = the filter gradient of x and dy (overwritten).
bool dnnlConvBackwardWeights(const ConvGeom &g, int64_t n, int64_t c,
                             int64_t o, const float *x, const float *dy,
                             float *dw);

} // namespace dlopt::rt::cpu
