/* The TFRecord frame around one record's data, for the two writers of TFRecord files: the
 * dataset writer (data/formats/tfrecord_writer.c) and the TensorBoard event writer (io/events.c).
 */
#ifndef CTRAIN_DATA_TFRECORD_FRAME_H
#define CTRAIN_DATA_TFRECORD_FRAME_H

#include <stddef.h>

#define CT__TFRECORD_HEAD_BYTES 12
#define CT__TFRECORD_FOOT_BYTES 4

/* Fills head with the little-endian uint64 `len` and the masked CRC-32C of those 8 bytes, and
 * foot with the masked CRC-32C of data[0..len): the record is then head, data, foot. */
void ct__tfrecord_frame(const void *data, size_t len, unsigned char head[CT__TFRECORD_HEAD_BYTES],
                        unsigned char foot[CT__TFRECORD_FOOT_BYTES]);

#endif
