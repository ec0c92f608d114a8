/* Walk the records of a Kafka v2 record batch without creating any object: the ingest's
 * validation before acknowledging, at a few nanoseconds a record.
 *
 * It accepts exactly what aiokafka's compiled reader (aiokafka/record/_crecords/
 * default_records.pyx, DefaultRecordBatch._read_msg and __next__), record_decode's reader,
 * accepts, record for record: tests/unit/buffer_agent/kafka/test_record_scan.py compares
 * them on valid, mutated and random input. Every read is bounds-checked (that reader reads
 * a varint past the end before it notices; it then always refuses, as this does at once).
 *
 * A record: length, attributes, timestampDelta, offsetDelta (zigzag varints), keyLength,
 * key, valueLength, value (a negative length is null), headerCount (not negative), then per
 * header: keyLength (not negative), key (UTF-8), valueLength, value. The lengths must add up
 * to the record's length, and the records to the section.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* A zigzag varint of at most 10 bytes, as aiokafka's decode_varint64 reads it; NULL when it
 * runs past ``end`` or is too long. */
static inline const unsigned char *read_varint(const unsigned char *p, const unsigned char *end,
                                               int64_t *out) {
    if (p < end && *p < 0x80) { /* most varints here are one byte */
        *out = (int64_t)(*p >> 1) ^ -(int64_t)(*p & 1);
        return p + 1;
    }
    uint64_t value = 0;
    int shift = 0;
    for (;;) {
        if (p >= end) {
            return NULL;
        }
        unsigned char byte = *p++;
        if (!(byte & 0x80)) {
            value |= (uint64_t)byte << shift;
            break;
        }
        value |= (uint64_t)(byte & 0x7f) << shift;
        shift += 7;
        if (shift > 63) {
            return NULL;
        }
    }
    *out = (int64_t)(value >> 1) ^ -(int64_t)(value & 1);
    return p;
}

/* Whether ``length`` bytes decode as UTF-8 the way Python's strict decoder does (aiokafka
 * decodes header keys with it). ASCII needs no decoder. */
static int valid_utf8(const unsigned char *start, Py_ssize_t length) {
    for (Py_ssize_t i = 0; i < length; i++) {
        if (start[i] & 0x80) {
            PyObject *text = PyUnicode_DecodeUTF8((const char *)start, length, "strict");
            if (text == NULL) {
                PyErr_Clear();
                return 0;
            }
            Py_DECREF(text);
            return 1;
        }
    }
    return 1;
}

#define VARINT(into, what)                                   \
    do {                                                     \
        p = read_varint(p, end, &(into));                    \
        if (p == NULL) {                                     \
            *error = "a varint (" what ") is cut off or longer than 10 bytes"; \
            return NULL;                                     \
        }                                                    \
    } while (0)

/* Skip ``length`` bytes; a negative length is null (nothing to skip) when ``nullable``. */
#define SKIP(length, nullable, what)                         \
    do {                                                     \
        if ((length) < 0) {                                  \
            if (!(nullable)) {                               \
                *error = what " has a negative length";      \
                return NULL;                                 \
            }                                                \
        } else if ((length) > (int64_t)(end - p)) {          \
            *error = what " runs past the end of the records"; \
            return NULL;                                     \
        } else {                                             \
            p += (length);                                   \
        }                                                    \
    } while (0)

/* One record at ``p``; the position after it, or NULL with ``*error`` set. */
static const unsigned char *scan_record(const unsigned char *p, const unsigned char *end,
                                        const char **error) {
    int64_t length, ignored, key_length, value_length, headers;
    VARINT(length, "length");
    const unsigned char *start = p;
    VARINT(ignored, "attributes");
    VARINT(ignored, "timestamp delta");
    VARINT(ignored, "offset delta");
    VARINT(key_length, "key length");
    SKIP(key_length, 1, "the key");
    VARINT(value_length, "value length");
    SKIP(value_length, 1, "the value");
    VARINT(headers, "header count");
    if (headers < 0) {
        *error = "the header count is negative";
        return NULL;
    }
    for (; headers > 0; headers--) {
        VARINT(key_length, "header key length");
        SKIP(key_length, 0, "a header key");
        if (!valid_utf8(p - key_length, (Py_ssize_t)key_length)) {
            *error = "a header key is not UTF-8";
            return NULL;
        }
        VARINT(value_length, "header value length");
        SKIP(value_length, 1, "a header value");
    }
    if ((int64_t)(p - start) != length) {
        *error = "its fields do not add up to its length";
        return NULL;
    }
    return p;
}

static PyObject *check_records(PyObject *module, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start, end;
    long long count;
    if (!PyArg_ParseTuple(args, "y*nnL", &view, &start, &end, &count)) {
        return NULL;
    }
    if (start < 0 || end > view.len || start > end) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "records section outside the buffer");
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)view.buf + start;
    const unsigned char *end_at = (const unsigned char *)view.buf + end;
    const char *error = NULL;
    long long index = 0;
    for (; index < count && p != NULL; index++) {
        p = scan_record(p, end_at, &error);
    }
    Py_ssize_t left = p == NULL ? 0 : end_at - p;
    PyBuffer_Release(&view);
    if (error != NULL) {
        PyErr_Format(PyExc_ValueError, "record %lld of %lld: %s", index - 1, count, error);
        return NULL;
    }
    if (left != 0) {
        PyErr_Format(PyExc_ValueError, "%zd bytes left over after %lld records", left, count);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"check_records", check_records, METH_VARARGS,
     "check_records(buffer, start, end, count): None, or ValueError saying what is wrong."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_record_scan",
    "Validate a record batch's records without creating objects (see the C source).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__record_scan(void) { return PyModule_Create(&module_def); }
