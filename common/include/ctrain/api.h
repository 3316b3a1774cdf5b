/* CT_API marks the functions that libctrain.so exports. The library is compiled with hidden
 * symbol visibility, so the internal ct__ functions (which the role libraries and the tests reach
 * by linking the static core) and the generated protobuf-c code stay inside it. */
#ifndef CTRAIN_API_H
#define CTRAIN_API_H

#ifdef __cplusplus /* C linkage for C++ callers (the CUDA kernels' tests) */
#define CT_API_LINKAGE extern "C"
#else
#define CT_API_LINKAGE
#endif
#if defined(__GNUC__)
#define CT_API CT_API_LINKAGE __attribute__((visibility("default")))
#else
#define CT_API CT_API_LINKAGE
#endif

#endif
