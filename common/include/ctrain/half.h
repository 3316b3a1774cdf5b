/* 16-bit float conversions (common/src/core/half.c). */
#ifndef CTRAIN_HALF_H
#define CTRAIN_HALF_H

#include "ctrain/api.h"

#include <stdint.h>

CT_API uint16_t ct_f32_to_bf16(float f);
CT_API float ct_bf16_to_f32(uint16_t h);
CT_API uint16_t ct_f32_to_fp16(float f);
CT_API float ct_fp16_to_f32(uint16_t h);

#endif
