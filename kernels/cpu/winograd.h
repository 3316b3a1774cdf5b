/* Winograd F(4x4, 3x3) convolutions (winograd.c), for conv.c's forward and input-gradient
 * kernels. */
#ifndef CT_KERNELS_CPU_WINOGRAD_H
#define CT_KERNELS_CPU_WINOGRAD_H

#include <stdint.h>

/* dst[n, oh, ow, oc] = sum over (kh, kw, ci) of src[n, oh - top + kh, ow - left + kw, ci] *
 * g[kh][kw][ci][oc] (src zero outside its src_h x src_w), then the epilogue. */
typedef struct ct__winograd_conv {
    const float *src; /* [batch, src_h, src_w, in_c] */
    int64_t batch, src_h, src_w, in_c, top, left;
    const float *taps[9]; /* g[kh][kw][ci][:] = taps[kh*3 + kw] + ci * tap_ld, out_c floats */
    int64_t tap_ld;
    float *dst; /* [batch, out_h, out_w, out_c] */
    int64_t out_h, out_w, out_c;
    const float *bias; /* epilogue: + bias[oc], then relu when set */
    int relu;
    const float *mask; /* or relu's gradient: dst = mask > 0 ? dst : 0 (dst's layout) */
} ct__winograd_conv;

/* Runs p with scratch: ct__winograd_floats(in_c, out_c) floats (graph/op_impl.h). */
void ct__winograd_conv2d(const ct__winograd_conv *p, float *scratch);

/* The filter gradient of the convolution p describes, with dst holding dy (taps, bias, relu
 * and mask unused): dw [3][3][in_c][out_c] = beta dw + sum over examples and outputs of
 * src's window times dy. Scratch as for ct__winograd_conv2d. */
void ct__winograd_conv2d_grad_filter(const ct__winograd_conv *p, float beta, float *dw,
                                     float *scratch);

#endif
