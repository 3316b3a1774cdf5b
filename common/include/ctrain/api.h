/* CT_API marks the functions that libctrain.so exports. The library is compiled with hidden
 * symbol visibility, so the internal ct__ functions (which the role libraries and the tests reach
 * by linking the static core) and the generated protobuf-c code stay inside it. */
#ifndef CTRAIN_API_H
#define CTRAIN_API_H

#if defined(__GNUC__)
#define CT_API __attribute__((visibility("default")))
#else
#define CT_API
#endif

#endif
