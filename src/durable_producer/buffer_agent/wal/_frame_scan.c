/* Decode many WAL frames in one call: the forwarder's reads, at well under a microsecond a
 * frame (the Python decoder takes about 3 us a frame, which is most of what a one-record
 * batch costs to forward); and recovery's scan of a segment when the log is opened
 * (scan_spans: where each valid frame lies, as numbers, with no object a frame).
 *
 * The frame layout is documented in volume/format.py (FRAME_PREFIX, FRAME_BODY_HEAD):
 *
 *     magic "\xd7WF1" | bodyLength u32 | crc32c u32 |
 *     offset u64 | partition i32 | recordCount u32 | appendedMs u64 | topicLength u16 |
 *     topic | payload
 *
 * all big-endian; the CRC32C is of the payload, continued over the body head and topic (the
 * payload's CRC is computed first, before the frame's offset is known). This decodes exactly
 * the frames wal/frame.py's decode_frame decodes, to the same values: it stops, without
 * judging, at the first position it cannot decode (too short, bad magic, length, CRC or topic
 * UTF-8), and the caller hands that position to decode_frame, which says what is there.
 * tests/unit/buffer_agent/wal/test_frame_scan.py compares the two on valid, damaged and random
 * input.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define PREFIX_SIZE 12
#define BODY_HEAD_SIZE 26
#define HEADER_SIZE (PREFIX_SIZE + BODY_HEAD_SIZE)
#define MAX_TOPIC_BYTES (249 * 4)
#define MAX_BODY_BYTES ((uint64_t)1 << 31)

static const unsigned char FRAME_MAGIC[4] = {0xd7, 'W', 'F', '1'};

/* ------------------------------------------------------------------ CRC32C (Castagnoli) */
static uint32_t crc_table[8][256];

static void crc_init_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
        for (int t = 1; t < 8; t++) {
            uint32_t c = crc_table[t - 1][i];
            crc_table[t][i] = (c >> 8) ^ crc_table[0][c & 0xff];
        }
    }
}

/* Slicing-by-8 in software: the fallback where the CPU has no CRC32C instruction. */
static uint32_t crc_soft(uint32_t crc, const unsigned char *p, size_t n) {
    crc = ~crc;
    while (n && ((uintptr_t)p & 7)) {
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xff];
        n--;
    }
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        word = __builtin_bswap64(word);
#endif
        word ^= crc;
        crc = crc_table[7][word & 0xff] ^ crc_table[6][(word >> 8) & 0xff] ^
              crc_table[5][(word >> 16) & 0xff] ^ crc_table[4][(word >> 24) & 0xff] ^
              crc_table[3][(word >> 32) & 0xff] ^ crc_table[2][(word >> 40) & 0xff] ^
              crc_table[1][(word >> 48) & 0xff] ^ crc_table[0][word >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xff];
    return ~crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_HW_CRC 1
/* SSE4.2's crc32 instruction computes CRC32C (about 8 bytes a cycle). */
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const unsigned char *p,
                                                         size_t n) {
    uint64_t c = ~crc;
    while (n && ((uintptr_t)p & 7)) {
        c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
        n--;
    }
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = __builtin_ia32_crc32di(c, word);
        p += 8;
        n -= 8;
    }
    while (n--) c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
    return ~(uint32_t)c;
}
#endif

static int use_hw_crc = 0;

static uint32_t crc32c(uint32_t crc, const unsigned char *p, size_t n) {
#ifdef HAVE_HW_CRC
    if (use_hw_crc) return crc_hw(crc, p, n);
#endif
    return crc_soft(crc, p, n);
}

/* ------------------------------------------------------------------ frames */
static inline uint64_t be64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
    return v;
}

static inline uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* A new tuple of ``type`` (a tuple subclass such as a NamedTuple, or tuple) with room for
 * ``size`` items, all NULL, to be set with PyTuple_SET_ITEM. Before Python 3.14 the type's
 * own allocator makes it in one allocation, one object for the collector. From 3.14 a tuple
 * caches its hash beside its items, which only tuple's constructor sets up: there the items
 * are made as a plain tuple first and handed to it (``as_tuple_of``). */
#if PY_VERSION_HEX < 0x030E0000
#define DIRECT_TUPLE_ALLOC 1
#else
#define DIRECT_TUPLE_ALLOC 0
#endif

static PyObject *new_tuple_of(PyTypeObject *type, Py_ssize_t size) {
    if (type == &PyTuple_Type || !DIRECT_TUPLE_ALLOC) return PyTuple_New(size);
    return type->tp_alloc(type, size);
}

/* ``items`` (made by new_tuple_of, stolen) as an instance of ``type``. */
static PyObject *as_tuple_of(PyTypeObject *type, PyObject *items) {
    if (type == &PyTuple_Type || DIRECT_TUPLE_ALLOC) return items;
    PyObject *args = PyTuple_Pack(1, items);
    Py_DECREF(items);
    if (args == NULL) return NULL;
    PyObject *made = PyTuple_Type.tp_new(type, args, NULL);
    Py_DECREF(args);
    return made;
}

/* One frame's fields, read by read_frame. */
typedef struct {
    uint64_t offset;
    int32_t partition;
    uint32_t record_count;
    uint64_t appended_ms;
    const unsigned char *topic;
    Py_ssize_t topic_length;
    const unsigned char *payload;
    Py_ssize_t payload_length;
    Py_ssize_t next; /* the position after the frame */
} FrameView;

/* The frame at ``pos`` if it is whole, its lengths possible and its CRC right (its offset at
 * most INT64_MAX; its topic's UTF-8 is topic_of's to check): 1 and *frame filled, else 0
 * (decode_frame says what is there). */
static int read_frame(const unsigned char *buf, Py_ssize_t n, Py_ssize_t pos, FrameView *frame) {
    if (n - pos < HEADER_SIZE) return 0;
    const unsigned char *p = buf + pos;
    if (memcmp(p, FRAME_MAGIC, 4) != 0) return 0;
    uint64_t body_length = be32(p + 4);
    uint32_t stored_crc = be32(p + 8);
    const unsigned char *body = p + PREFIX_SIZE;
    frame->offset = be64(body);
    if (frame->offset > (uint64_t)INT64_MAX) return 0; /* no offset of this log */
    frame->partition = (int32_t)be32(body + 8);
    frame->record_count = be32(body + 12);
    frame->appended_ms = be64(body + 16);
    frame->topic_length = (Py_ssize_t)body[24] << 8 | body[25];
    if (body_length < (uint64_t)(BODY_HEAD_SIZE + frame->topic_length) ||
        body_length > MAX_BODY_BYTES || frame->topic_length > MAX_TOPIC_BYTES)
        return 0;
    if (body_length > (uint64_t)(n - pos - PREFIX_SIZE)) return 0; /* incomplete */
    frame->topic = body + BODY_HEAD_SIZE;
    frame->payload = frame->topic + frame->topic_length;
    const unsigned char *end = body + body_length;
    frame->payload_length = end - frame->payload;
    uint32_t crc = crc32c(0, frame->payload, (size_t)frame->payload_length);
    crc = crc32c(crc, body, (size_t)(frame->payload - body));
    if (crc != stored_crc) return 0;
    frame->next = pos + PREFIX_SIZE + (Py_ssize_t)body_length;
    return 1;
}

/* The last topic decoded: consecutive frames of one topic share the str, decoded once. */
typedef struct {
    PyObject *text;
    const unsigned char *bytes;
    Py_ssize_t length;
} Topic;

/* ``frame``'s topic as a str in *topic (a new one only where it differs from the last):
 * 1, or 0 when it is not UTF-8 (no exception left: decode_frame reports it). */
static int topic_of(const FrameView *frame, Topic *topic) {
    if (topic->text != NULL && frame->topic_length == topic->length &&
        memcmp(frame->topic, topic->bytes, (size_t)topic->length) == 0)
        return 1;
    PyObject *decoded =
        PyUnicode_DecodeUTF8((const char *)frame->topic, frame->topic_length, "strict");
    if (decoded == NULL) {
        PyErr_Clear();
        return 0;
    }
    Py_XSETREF(topic->text, decoded);
    topic->bytes = frame->topic;
    topic->length = frame->topic_length;
    return 1;
}

static PyObject *scan_frames(PyObject *Py_UNUSED(module), PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos, max_frames, budget;
    unsigned long long wanted;
    PyTypeObject *frame_type;
    if (!PyArg_ParseTuple(args, "y*nnnKO!", &view, &pos, &max_frames, &budget, &wanted,
                          &PyType_Type, &frame_type))
        return NULL;
    if (!PyType_IsSubtype(frame_type, &PyTuple_Type)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "frame_type must be a tuple type");
        return NULL;
    }
    if (pos < 0) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "pos %zd is before the buffer's start", pos);
        return NULL;
    }
    const unsigned char *buf = view.buf;
    Py_ssize_t n = view.len;
    PyObject *frames = PyList_New(0);
    Topic topic = {NULL, NULL, -1};
    /* The last append time made: frames appended in one millisecond (a busy log's most) share
     * the int, made once. */
    PyObject *appended = NULL;
    uint64_t appended_ms = 0;
    FrameView frame;
    if (frames == NULL) goto fail;
    while (pos < n && PyList_GET_SIZE(frames) < max_frames && budget > 0) {
        if (!read_frame(buf, n, pos, &frame) || !topic_of(&frame, &topic)) break;
        if (frame.offset >= wanted) {
            PyObject *items = new_tuple_of(frame_type, 6);
            if (items == NULL) goto fail;
            Py_INCREF(topic.text);
            PyTuple_SET_ITEM(items, 1, topic.text);
            PyObject *item;
#define SET(index, made)                  \
    if ((item = (made)) == NULL) {        \
        Py_DECREF(items);                 \
        goto fail;                        \
    }                                     \
    PyTuple_SET_ITEM(items, index, item)
            SET(0, PyLong_FromUnsignedLongLong(frame.offset));
            SET(2, PyLong_FromLong(frame.partition));
            SET(3, PyBytes_FromStringAndSize((const char *)frame.payload, frame.payload_length));
            SET(4, PyLong_FromUnsignedLong(frame.record_count));
            if (appended == NULL || frame.appended_ms != appended_ms) {
                Py_XSETREF(appended, PyLong_FromUnsignedLongLong(frame.appended_ms));
                appended_ms = frame.appended_ms;
            }
            SET(5, Py_XNewRef(appended));
#undef SET
            PyObject *made = as_tuple_of(frame_type, items);
            if (made == NULL) goto fail;
            /* Its items are ints, a str and bytes, and it has no instance dict: it can be in no
             * cycle. CPython's collector never untracks a tuple subclass's instance itself, and
             * traversed each frame read ahead in every collection it lived through. */
            if (frame_type->tp_dictoffset == 0 && PyObject_GC_IsTracked(made))
                PyObject_GC_UnTrack(made);
            if (PyList_Append(frames, made) < 0) {
                Py_DECREF(made);
                goto fail;
            }
            Py_DECREF(made);
            budget -= frame.payload_length;
            wanted = frame.offset + 1;
        }
        pos = frame.next;
    }
    Py_XDECREF(topic.text);
    Py_XDECREF(appended);
    PyBuffer_Release(&view);
    return Py_BuildValue("(NnKn)", frames, pos, wanted, budget);
fail:
    Py_XDECREF(topic.text);
    Py_XDECREF(appended);
    Py_XDECREF(frames);
    PyBuffer_Release(&view);
    return NULL;
}

/* ------------------------------------------------------------------ recovery's scan */
/* A growable array of int64 (native order, read by Python's array("q").frombytes). */
typedef struct {
    int64_t *items;
    Py_ssize_t length, capacity;
} Int64s;

static int int64s_push(Int64s *a, int64_t value) {
    if (a->length == a->capacity) {
        Py_ssize_t capacity = a->capacity ? a->capacity * 2 : 1024;
        int64_t *grown = PyMem_Realloc(a->items, (size_t)capacity * sizeof(int64_t));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        a->items = grown;
        a->capacity = capacity;
    }
    a->items[a->length++] = value;
    return 0;
}

static PyObject *int64s_bytes(Int64s *a) {
    return PyBytes_FromStringAndSize((const char *)a->items,
                                     a->length * (Py_ssize_t)sizeof(int64_t));
}

/* Recovery's scan of a segment: the valid frames from pos on, each offset above the one
 * before, as runs, and spans if keep_spans (numbers: no object a frame, no payload copied),
 * with their bytes together. It stops at
 * the first position that holds no whole valid frame, or a frame whose offset does not
 * follow ``last_offset`` (or is above INT64_MAX), or after max_frames: there the caller's
 * frame-at-a-time scan (decode_frame) says what is there. */
static PyObject *scan_spans(PyObject *Py_UNUSED(module), PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos, max_frames;
    long long last_offset;
    int keep_spans;
    if (!PyArg_ParseTuple(args, "y*nLnp", &view, &pos, &last_offset, &max_frames, &keep_spans))
        return NULL;
    if (pos < 0) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "pos %zd is before the buffer's start", pos);
        return NULL;
    }
    const unsigned char *buf = view.buf;
    Py_ssize_t n = view.len, frames = 0;
    long long frame_bytes = 0;
    Int64s spans = {NULL, 0, 0}, runs = {NULL, 0, 0};
    Topic topic = {NULL, NULL, -1};
    FrameView frame;
    PyObject *result = NULL;
    while (pos < n && frames < max_frames) {
        if (!read_frame(buf, n, pos, &frame) || (long long)frame.offset <= last_offset ||
            !topic_of(&frame, &topic))
            break;
        int64_t offset = (int64_t)frame.offset, records = frame.record_count;
        if (keep_spans && (int64s_push(&spans, offset) < 0 || int64s_push(&spans, pos) < 0 ||
                           int64s_push(&spans, frame.next) < 0 ||
                           int64s_push(&spans, records) < 0))
            goto done;
        int64_t *run = runs.length ? runs.items + runs.length - 3 : NULL;
        if (run != NULL && offset == run[0] + run[1] && records == run[2]) {
            run[1]++;
        } else if (int64s_push(&runs, offset) < 0 || int64s_push(&runs, 1) < 0 ||
                   int64s_push(&runs, records) < 0) {
            goto done;
        }
        frame_bytes += frame.next - pos;
        last_offset = offset;
        frames++;
        pos = frame.next;
    }
    PyObject *spans_bytes = int64s_bytes(&spans);
    PyObject *runs_bytes = spans_bytes ? int64s_bytes(&runs) : NULL;
    if (runs_bytes != NULL)
        result = Py_BuildValue("(NNLnL)", spans_bytes, runs_bytes, frame_bytes, pos, last_offset);
    else
        Py_XDECREF(spans_bytes);
done:
    Py_XDECREF(topic.text);
    PyMem_Free(spans.items);
    PyMem_Free(runs.items);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *crc32c_py(PyObject *Py_UNUSED(module), PyObject *args) {
    Py_buffer view;
    unsigned int value = 0;
    int software = 0;
    if (!PyArg_ParseTuple(args, "y*|Ip", &view, &value, &software)) return NULL;
    uint32_t crc = software ? crc_soft(value, view.buf, (size_t)view.len)
                            : crc32c(value, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

static PyMethodDef methods[] = {
    {"scan_frames", scan_frames, METH_VARARGS,
     "scan_frames(data, pos, max_frames, max_bytes, wanted, frame_type) -> (frames, end, "
     "wanted, max_bytes left): the frames decoded from pos on (those below wanted skipped), as frame_type "
     "tuples, until max_frames, max_bytes of payload or the first position that is no whole "
     "valid frame (end)."},
    {"scan_spans", scan_spans, METH_VARARGS,
     "scan_spans(data, pos, last_offset, max_frames, keep_spans) -> (spans, runs, frame_bytes, "
     "end, last_offset): recovery's scan: the valid frames from pos on whose offsets follow "
     "last_offset, as native int64s (offset, start, end, record count a frame, if keep_spans; first offset, "
     "frames, record count a run of consecutive offsets with one count), until max_frames or "
     "end, the first position that holds no whole valid frame following the one before."},
    {"crc32c", crc32c_py, METH_VARARGS,
     "crc32c(data, value=0, software=False): the CRC32C this module checks frames with (the "
     "CPU's instruction where it has one; software: the table-driven fallback), for tests."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_frame_scan",
    "Decode WAL frames many at a time (see the C source).", -1, methods,
};

PyMODINIT_FUNC PyInit__frame_scan(void) {
    crc_init_table();
#ifdef HAVE_HW_CRC
    __builtin_cpu_init();
    use_hw_crc = __builtin_cpu_supports("sse4.2");
#endif
    return PyModule_Create(&module_def);
}
