/* The CUDA backend's entry points (kernels/cuda/backend.cu): not yet part of libctrain (the
 * trainer's placement falls back to the CPU, docs/cuda.md); the tests and the GPU run use it. */
#ifndef CTRAIN_CUDA_BACKEND_H
#define CTRAIN_CUDA_BACKEND_H

#include "ctrain/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A backend on GPU `device` (the stand-in: host memory). CT_ECUDA naming the device and the CUDA
 * runtime's reason when there is none. Destroy with ct_backend_cuda_destroy. */
ct_status ct_backend_cuda_create(int device, ct_backend **ret, ct_err *err);
void ct_backend_cuda_destroy(ct_backend *be);
/* 1 when op has a CUDA kernel. */
int ct_backend_cuda_has_kernel(int op);

#ifdef __cplusplus
}
#endif

#endif
