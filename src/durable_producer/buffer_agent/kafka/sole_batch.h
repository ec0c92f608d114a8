/* Is a stored frame's payload exactly one client batch? The check itself, in C, for the two
 * compiled modules that ask it: _batch_merge.c's sole_batch (for Python) and
 * _number_frames.c, which asks it of every frame it numbers without a call or a tuple; with
 * the batch header's size and big-endian read, which _batch_merge.c's merge uses too.
 *
 * record_batch.sole_batch_python is the reference: one v2 batch (magic 2) whose batchLength
 * covers the data exactly, at least a header long, with a record count that is not negative.
 * The header's layout (record_batch.py): baseOffset i64 | batchLength i32 |
 * partitionLeaderEpoch i32 | magic i8 | crc u32 | attributes i16 | ... | recordCount i32
 * (at byte 57 of 61), big-endian.
 */
#ifndef DURABLE_PRODUCER_SOLE_BATCH_H
#define DURABLE_PRODUCER_SOLE_BATCH_H

#include <stddef.h>
#include <stdint.h>

#define BATCH_HEADER_SIZE 61

static inline int32_t batch_be32(const unsigned char *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) |
                     p[3]);
}

/* 1 and *count, *attributes set when the n bytes at p are exactly one batch, else 0. */
static inline int read_sole_batch(const unsigned char *p, size_t n, int32_t *count,
                                  int16_t *attributes) {
    if (n < BATCH_HEADER_SIZE) return 0;
    int32_t length = batch_be32(p + 8);
    int32_t records = batch_be32(p + 57);
    if (p[16] != 2 || (int64_t)length + 12 != (int64_t)n ||
        length < BATCH_HEADER_SIZE - 12 || records < 0)
        return 0;
    *count = records;
    *attributes = (int16_t)(((uint16_t)p[21] << 8) | p[22]);
    return 1;
}

#endif
