/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, init and final xor 0xFFFFFFFF), as in
 * TFRecord framing and checkpoint tensors. ct_crc32c("123456789") == 0xE3069283. */
#ifndef CTRAIN_CRC32C_H
#define CTRAIN_CRC32C_H

#include "ctrain/api.h"

#include <stddef.h>
#include <stdint.h>

/* Extends crc (0 to start) over len bytes. Hardware SSE4.2 instructions when available. */
CT_API uint32_t ct_crc32c(uint32_t crc, const void *data, size_t len);
/* TensorFlow's masked form: ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
CT_API uint32_t ct_crc32c_mask(uint32_t crc);

#endif
