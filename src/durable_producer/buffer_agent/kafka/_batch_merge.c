/* Merge consecutive uncompressed Kafka v2 record batches of one partition into one batch.
 *
 * Records keep their bytes (attributes, key, value, headers); only each record's framing is
 * written again: its length, its timestamp delta (against the first batch's base timestamp)
 * and its offset delta (its position in the merged batch). The header takes the first
 * batch's attributes and base timestamp, the largest max timestamp, the record count; its
 * producer fields and CRC are left for the caller to stamp (``batch_stamp``). The caller checks
 * that every batch is uncompressed, with the same attributes, and valid (the ingest validated
 * them with ``_record_scan`` before acknowledging): anything malformed raises ValueError.
 *
 * The merged batch holds the first batch and as many of the next as fit in ``limit`` bytes
 * (whole batches; the first always): the caller plans a merge by its parts' lengths, and a
 * record's new framing may be longer than its old one (its deltas grow with its distance
 * from the first record), so only the merge knows the exact size. The batches left out are
 * the caller's to send in a later batch.
 *
 * A record: length (varint), attributes (int8), timestampDelta (varlong), offsetDelta (varint),
 * then key, value and headers (copied as they are).
 *
 * Also sole_batch: the record count and attributes of a stored frame that is one batch
 * (record_batch.sole_batch_python is the reference; the check is sole_batch.h's, which
 * _number_frames.c asks of each frame it numbers without this call).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "sole_batch.h"

static uint64_t zigzag(int64_t v) { return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63); }

static int64_t unzigzag(uint64_t v) { return (int64_t)(v >> 1) ^ -(int64_t)(v & 1); }

static const unsigned char *read_uvarint(const unsigned char *p, const unsigned char *end,
                                         uint64_t *out) {
    uint64_t value = 0;
    for (int shift = 0; shift <= 63; shift += 7) {
        if (p >= end) return NULL;
        unsigned char byte = *p++;
        value |= (uint64_t)(byte & 0x7f) << shift;
        if (!(byte & 0x80)) {
            *out = value;
            return p;
        }
    }
    return NULL;
}

static unsigned char *write_uvarint(unsigned char *p, uint64_t v) {
    while (v > 0x7f) {
        *p++ = (unsigned char)((v & 0x7f) | 0x80);
        v >>= 7;
    }
    *p++ = (unsigned char)v;
    return p;
}

static int64_t be64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
    return (int64_t)v;
}

static void put64(unsigned char *p, int64_t value) {
    uint64_t v = (uint64_t)value;
    for (int i = 7; i >= 0; i--, v >>= 8) p[i] = (unsigned char)v;
}

static void put32(unsigned char *p, int32_t value) {
    uint32_t v = (uint32_t)value;
    for (int i = 3; i >= 0; i--, v >>= 8) p[i] = (unsigned char)v;
}

static PyObject *merge_fitting(PyObject *module, PyObject *args) {
    PyObject *arg;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "On:merge_fitting", &arg, &limit)) return NULL;
    PyObject *seq = PySequence_Fast(arg, "merge_fitting takes a sequence of batches");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Py_buffer *views = n ? PyMem_Calloc((size_t)n, sizeof(Py_buffer)) : NULL;
    PyObject *result = NULL;
    Py_ssize_t got = 0;
    if (n == 0 || views == NULL) {
        PyErr_SetString(PyExc_ValueError, "merge_fitting needs at least one batch");
        goto done;
    }
    Py_ssize_t capacity = BATCH_HEADER_SIZE;
    for (; got < n; got++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, got), &views[got], PyBUF_SIMPLE) < 0)
            goto done;
        if (views[got].len < BATCH_HEADER_SIZE) {
            PyErr_SetString(PyExc_ValueError, "a batch is shorter than its header");
            got++; /* its buffer is held: released below */
            goto done;
        }
        /* a record's new framing takes at most 10 + 1 + 10 + 5 bytes and its old one at least
         * 4: 24 spare bytes a record always suffice. */
        int32_t count = batch_be32((const unsigned char *)views[got].buf + 57);
        if (count < 0) {
            PyErr_SetString(PyExc_ValueError, "a batch has a negative record count");
            got++; /* its buffer is held: released below */
            goto done;
        }
        capacity += views[got].len - BATCH_HEADER_SIZE + (Py_ssize_t)count * 24;
    }
    result = PyBytes_FromStringAndSize(NULL, capacity);
    if (result == NULL) goto done;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(result);
    unsigned char *w = out + BATCH_HEADER_SIZE;
    const unsigned char *first = views[0].buf;
    int64_t base_ts = be64(first + 27);
    int64_t max_ts = INT64_MIN;
    int64_t offset = 0;
    Py_ssize_t taken = n;
    for (Py_ssize_t b = 0; b < n; b++) {
        unsigned char *batch_start = w;
        const unsigned char *batch = views[b].buf;
        const unsigned char *end = batch + views[b].len;
        int64_t batch_ts = be64(batch + 27);
        int64_t batch_max = be64(batch + 35);
        if (batch_max > max_ts) max_ts = batch_max;
        int32_t count = batch_be32(batch + 57);
        const unsigned char *p = batch + BATCH_HEADER_SIZE;
        for (int32_t r = 0; r < count; r++) {
            uint64_t length_raw, ts_raw, od_raw;
            p = read_uvarint(p, end, &length_raw);
            if (p == NULL) goto malformed;
            int64_t length = unzigzag(length_raw);
            if (length < 2 || length > end - p) goto malformed;
            const unsigned char *record_end = p + length;
            unsigned char attributes = *p++;
            p = read_uvarint(p, record_end, &ts_raw);
            if (p == NULL) goto malformed;
            p = read_uvarint(p, record_end, &od_raw);
            if (p == NULL) goto malformed;
            int64_t timestamp = batch_ts + unzigzag(ts_raw);
            unsigned char framing[21];
            unsigned char *f = framing;
            *f++ = attributes;
            f = write_uvarint(f, zigzag(timestamp - base_ts));
            f = write_uvarint(f, zigzag(offset));
            Py_ssize_t rest = record_end - p;
            Py_ssize_t new_length = (f - framing) + rest;
            w = write_uvarint(w, zigzag(new_length));
            memcpy(w, framing, (size_t)(f - framing));
            w += f - framing;
            memcpy(w, p, (size_t)rest);
            w += rest;
            p = record_end;
            offset++;
        }
        if (p != end) goto malformed;
        if (b > 0 && w - out > limit) { /* left out, with every batch after it */
            w = batch_start;
            offset -= count;
            max_ts = INT64_MIN;
            for (Py_ssize_t i = 0; i < b; i++) {
                int64_t batch_max_ts = be64((const unsigned char *)views[i].buf + 35);
                if (batch_max_ts > max_ts) max_ts = batch_max_ts;
            }
            taken = b;
            break;
        }
    }
    Py_ssize_t size = w - out;
    memcpy(out, first, BATCH_HEADER_SIZE);
    put64(out, 0);                          /* base offset */
    put32(out + 8, (int32_t)(size - 12));   /* batch length */
    put32(out + 12, -1);                    /* partition leader epoch */
    memset(out + 17, 0, 4);                 /* CRC: stamped by the caller */
    put32(out + 23, (int32_t)(offset - 1)); /* last offset delta */
    put64(out + 27, base_ts);
    put64(out + 35, max_ts);
    put32(out + 57, (int32_t)offset);
    if (_PyBytes_Resize(&result, size) < 0) {
        result = NULL;
        goto done;
    }
    result = Py_BuildValue("(Nn)", result, taken); /* N: the pair takes the bytes' reference */
    goto done;
malformed:
    PyErr_SetString(PyExc_ValueError, "a record's framing is malformed");
    Py_CLEAR(result);
done:
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    Py_DECREF(seq);
    return result;
}

/* sole_batch(data): (record count, attributes) when data is exactly one v2 batch whose header
 * record_batch.parse_batch_header accepts, else None: record_batch.sole_batch, the reference,
 * says what it is. A call here costs a tenth of the Python one. */
static PyObject *sole_batch(PyObject *module, PyObject *arg) {
    Py_buffer view;
    const unsigned char *p;
    Py_ssize_t n;
    int release = 0;
    if (PyBytes_CheckExact(arg)) {
        p = (const unsigned char *)PyBytes_AS_STRING(arg);
        n = PyBytes_GET_SIZE(arg);
    } else {
        if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
        p = view.buf;
        n = view.len;
        release = 1;
    }
    int32_t count;
    int16_t attributes;
    PyObject *result = read_sole_batch(p, (size_t)n, &count, &attributes)
                           ? Py_BuildValue("(ii)", (int)count, (int)attributes)
                           : Py_NewRef(Py_None);
    if (release) PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"sole_batch", sole_batch, METH_O,
     "sole_batch(data): (record count, attributes) of data that is exactly one batch, or None."},
    {"merge_fitting", merge_fitting, METH_VARARGS,
     "merge_fitting(batches, limit): (one uncompressed v2 batch holding the records of the"
     " first batches that fit in limit bytes, how many it holds). Named anew when it took a"
     " limit: a module built from the older source has no such function."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_batch_merge",
    "Merge uncompressed record batches of one partition; read a stored batch's count"
    " (see the C source).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__batch_merge(void) { return PyModule_Create(&module_def); }
