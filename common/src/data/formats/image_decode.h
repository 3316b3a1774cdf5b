/* Decoding of JPEG (libjpeg-turbo) and PNG (libpng) files for the image sources. */
#ifndef CTRAIN_DATA_IMAGE_DECODE_H
#define CTRAIN_DATA_IMAGE_DECODE_H

#include <stddef.h>

#include "ctrain/dataset.h"

/* Decodes the JPEG or PNG image in data[0..n) (told apart by their magic bytes) into component
 * i of ret: u8 [height, width, channels], channels 1 (gray) or 3 (RGB) as asked, or as stored
 * when `channels` is 0 (gray stays 1, anything else becomes 3; an alpha channel is composited
 * onto black). CT_EFORMAT names `path` for data that is neither format, corrupt or cut short (a
 * JPEG warning such as premature end of data counts as corrupt), in a form the decoder cannot
 * convert (a CMYK JPEG), or too large; CT_ENOMEM. Never prints. Thread-safe. */
ct_status ct__image_decode(const char *path, const unsigned char *data, size_t n, int channels,
                           ct_element *ret, int i, ct_err *err);

#endif
