// The layer math as free functions over raw row-major arrays, one op family per file in
// src/layers/. Each is a template instantiated for float (training) and double (the
// finite-difference gradient checks in tests/), so the code that is checked is the code that
// trains. Gradients are written, not accumulated: a backward call overwrites dw, db and dx.
// Activations are NHWC, so a 3x3 convolution over a whole batch is one GEMM.
#pragma once

#include <cstdint>

namespace ringtrain {

// ---- Dense: y[B,out] = x[B,in] * w[in,out] + b[out] ----
template <typename T>
void dense_forward(const T* x, const T* w, const T* b, T* y, int64_t batch, int64_t in,
                   int64_t out);
// dw[in,out] = x^T dy and db[out] = column sums of dy (skipped when dw is null);
// dx[B,in] = dy w^T (skipped when dx is null).
template <typename T>
void dense_backward(const T* x, const T* w, const T* dy, T* dw, T* db, T* dx, int64_t batch,
                    int64_t in, int64_t out);

// Rows [row_begin, row_end) of dw only: dw[r, :] = x[:, r]^T dy. Pieces of dense_backward's
// weight gradient, for reporting a large layer's gradients as they are finished.
template <typename T>
void dense_backward_weight_rows(const T* x, const T* dy, T* dw, int64_t batch, int64_t in,
                                int64_t out, int64_t row_begin, int64_t row_end);

// ---- ReLU, elementwise over n values ----
template <typename T>
void relu_forward(const T* x, T* y, int64_t n);
// dx = dy where the output was positive, else 0.
template <typename T>
void relu_backward(const T* y, const T* dy, T* dx, int64_t n);

// ---- Conv2D 3x3, stride 1, 'same' zero padding, with bias ----
// x[B,H,W,Cin], w[3,3,Cin,Cout], b[Cout], y[B,H,W,Cout].
// Two implementations of the same math: direct loops with the channel counts fixed at compile
// time for the small channel counts where GEMM is mostly packing overhead (1->8, 8->16: the
// cnn model), and im2col + one GEMM over the whole batch for everything else. Only the im2col
// path needs scratch: cols and dcols of B*H*W*9*Cin values each (pass null otherwise).
bool conv2d_uses_im2col(int64_t cin, int64_t cout);
template <typename T>
void conv2d_forward(const T* x, const T* w, const T* b, T* y, T* cols, int64_t batch,
                    int64_t height, int64_t width, int64_t cin, int64_t cout);
// The im2col path expects cols to still hold forward's im2col of x. dw (with db) and dx may
// each be null to skip that part: the first layer needs no dx.
template <typename T>
void conv2d_backward(const T* x, const T* cols, const T* w, const T* dy, T* dw, T* db, T* dx,
                     T* dcols, int64_t batch, int64_t height, int64_t width, int64_t cin,
                     int64_t cout);

// ---- MaxPool2D 2x2, stride 2 (H and W even) ----
// x[B,H,W,C] -> y[B,H/2,W/2,C].
template <typename T>
void maxpool2d_forward(const T* x, T* y, int64_t batch, int64_t height, int64_t width,
                       int64_t channels);
// The gradient goes to the first position (row-major within the window) holding the max.
template <typename T>
void maxpool2d_backward(const T* x, const T* y, const T* dy, T* dx, int64_t batch, int64_t height,
                        int64_t width, int64_t channels);

// ---- Fused softmax cross-entropy over logits[B,classes] ----
// Returns the mean loss over the batch; writes dlogits = (softmax - onehot) / B when dlogits
// is not null, and the number of rows whose arg-max equals the label into *correct when not
// null. Labels outside [0, classes) throw.
template <typename T>
double softmax_xent(const T* logits, const int32_t* labels, T* dlogits, int64_t batch,
                    int64_t classes, int64_t* correct);

}  // namespace ringtrain
