/* Number a run of WAL frames into their partitions' queues in one call: the forwarder's main
 * line for each frame it reads (Forwarder._read), at a fraction of the Python loop's cost.
 *
 * partition_queue.number_frames_python is the reference: this does exactly what it does, and
 * tests/unit/buffer_agent/forward/test_number_frames.py compares the two on random runs. For
 * each frame from ``start`` (a WAL Frame tuple: offset, topic, partition, payload,
 * record_count, appended_ms) it stops, without judging, at the first that is not on the main
 * line: an offset below ``plain_from``, a payload that is not one client batch (sole_batch.h's
 * check, asked here without a call or a tuple; ``sole_batch`` in the reference), or a
 * partition without its queue in ``queues``. Otherwise it numbers the frame
 * as PartitionQueue.add does: the queue's ``next_sequence`` becomes (sequence + records) modulo
 * ``sequence_limit``, and the Pending tuple (offset, batch, records, sequence, attributes,
 * 0, False, appended_ms) goes at the end of the queue's ``frames``. A Pending that holds only
 * ints and bytes is untracked by the garbage collector at once, as CPython's collector would
 * untrack it at its first collection (``untrackable``: CPython's own rule).
 *
 * Whatever the queues' attributes or their frames' ``append`` run (Python code, in a test),
 * nothing used here is borrowed across it: the frame, each slot's topic and queue are held.
 *
 * Returns (stop, records, bytes): where it stopped (len(frames) when it numbered them all),
 * the records and payload bytes of the frames it numbered. Any exception (from an attribute,
 * an append, a value out of range) is raised as it is.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "sole_batch.h"

#define FRAME_FIELDS 6
#define PENDING_FIELDS 8

static PyObject *str_next_sequence;
static PyObject *str_frames;
static PyObject *str_append;
static PyObject *str_popleft;
static PyObject *zero;

/* Python's modulo for a positive ``limit``: never negative. */
static long long py_mod(long long value, long long limit) {
    long long result = value % limit;
    return result < 0 ? result + limit : result;
}

/* CPython's rule (_PyObject_GC_MAY_BE_TRACKED, tuple's untracking at a collection): a tuple may
 * be untracked when no item may be part of a cycle: none is a container, except exact tuples
 * that are untracked themselves (an untracked dict may become tracked later: it counts). */
static int untrackable(PyObject *tuple) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tuple); i++) {
        PyObject *item = PyTuple_GET_ITEM(tuple, i);
        if (PyObject_IS_GC(item) && (!PyTuple_CheckExact(item) || PyObject_GC_IsTracked(item)))
            return 0;
    }
    return 1;
}

/* A queue met in this call: its numbering is kept here and written back once, at the end. The
 * frames of a run interleave a few partitions; the frame scan gives consecutive frames one
 * topic object, and small partition numbers are shared ints, so most frames find their slot
 * by identity, without building a key. */
#define SLOTS 32
typedef struct {
    PyObject *topic;     /* owned (compared by identity: held, its address is not reused) */
    long partition;
    PyObject *queue;     /* owned */
    PyObject *append;    /* owned: the bound append of the queue's ``frames`` */
    long long next;      /* the queue's next_sequence */
} Slot;

typedef struct {
    Slot slot[SLOTS];
    int used;
} Slots;

static Slot *find_slot(Slots *slots, PyObject *topic, long partition) {
    for (int i = 0; i < slots->used; i++) {
        Slot *slot = &slots->slot[i];
        if (slot->topic == topic && slot->partition == partition) return slot;
    }
    return NULL;
}

/* The slot of ``queue`` (met under another topic object, or new); NULL with no exception when
 * every slot is taken, NULL with one on failure. */
static Slot *slot_of_queue(Slots *slots, PyObject *queue, PyObject *topic, long partition) {
    for (int i = 0; i < slots->used; i++) {
        Slot *slot = &slots->slot[i];
        if (slot->queue == queue) {
            Py_INCREF(topic);
            Py_SETREF(slot->topic, topic);
            slot->partition = partition;
            return slot;
        }
    }
    if (slots->used == SLOTS) return NULL;
    Py_INCREF(queue); /* borrowed from ``queues``, which the attributes' code could change */
    PyObject *append = NULL;
    long long next = -1;
    PyObject *sequence = PyObject_GetAttr(queue, str_next_sequence);
    if (sequence != NULL) {
        next = PyLong_AsLongLong(sequence);
        Py_DECREF(sequence);
    }
    if (!PyErr_Occurred()) {
        PyObject *frames = PyObject_GetAttr(queue, str_frames);
        if (frames != NULL) {
            append = PyObject_GetAttr(frames, str_append);
            Py_DECREF(frames);
        }
    }
    if (append == NULL) {
        Py_DECREF(queue);
        return NULL;
    }
    Slot *slot = &slots->slot[slots->used++];
    Py_INCREF(topic);
    slot->topic = topic;
    slot->partition = partition;
    slot->queue = queue;
    slot->append = append;
    slot->next = next;
    return slot;
}

/* Write each queue's numbering back and let the slots go: 0, or -1 with an exception (the
 * first failure's; every slot is let go all the same). */
static int write_back(Slots *slots) {
    int failed = 0;
    for (int i = 0; i < slots->used; i++) {
        Slot *slot = &slots->slot[i];
        if (!failed) {
            PyObject *next = PyLong_FromLongLong(slot->next);
            if (next == NULL || PyObject_SetAttr(slot->queue, str_next_sequence, next) < 0)
                failed = 1;
            Py_XDECREF(next);
        }
        Py_DECREF(slot->topic);
        Py_DECREF(slot->queue);
        Py_DECREF(slot->append);
    }
    slots->used = 0;
    return failed ? -1 : 0;
}

/* Number one main-line frame: the Pending tuple to ``append``, ``*next`` moved on. 0, or -1
 * with an exception. */
static int number_one(PyObject *append, long long *next, PyObject *frame, int32_t count,
                      int16_t attributes, long long limit) {
    PyObject *pending = PyTuple_New(PENDING_FIELDS);
    if (pending == NULL) return -1;
    PyObject *made[3] = {PyLong_FromLong(count), PyLong_FromLongLong(*next),
                         PyLong_FromLong(attributes)}; /* records, sequence, attributes */
    if (made[0] == NULL || made[1] == NULL || made[2] == NULL) {
        for (int i = 0; i < 3; i++) Py_XDECREF(made[i]);
        Py_DECREF(pending);
        return -1;
    }
    PyObject *items[PENDING_FIELDS] = {
        PyTuple_GET_ITEM(frame, 0), PyTuple_GET_ITEM(frame, 3), made[0], made[1],
        made[2], zero, Py_False, PyTuple_GET_ITEM(frame, 5),
    };
    for (int i = 0; i < PENDING_FIELDS; i++) {
        if (i < 2 || i > 4) Py_INCREF(items[i]); /* those made here are ours already */
        PyTuple_SET_ITEM(pending, i, items[i]);
    }
    if (untrackable(pending)) PyObject_GC_UnTrack(pending);
    PyObject *done = PyObject_CallOneArg(append, pending);
    Py_DECREF(pending);
    if (done == NULL) return -1;
    Py_DECREF(done);
    *next = py_mod(*next + count, limit);
    return 0;
}

/* The slot for ``frame``'s partition; *stop set (and NULL) when it has no queue, NULL with an
 * exception on failure; with every slot taken, a slot of its own for this frame only (the
 * caller writes it back at once). */
static Slot *slot_for(Slots *slots, PyObject *queues, PyObject *frame, int *stop) {
    PyObject *topic = PyTuple_GET_ITEM(frame, 1);
    long partition = PyLong_AsLong(PyTuple_GET_ITEM(frame, 2));
    if (partition == -1 && PyErr_Occurred()) return NULL;
    Slot *slot = find_slot(slots, topic, partition);
    if (slot != NULL) return slot;
    PyObject *key = PyTuple_Pack(2, topic, PyTuple_GET_ITEM(frame, 2));
    if (key == NULL) return NULL;
    PyObject *queue = PyDict_GetItemWithError(queues, key); /* borrowed */
    Py_DECREF(key);
    if (queue == NULL) {
        if (!PyErr_Occurred()) *stop = 1;
        return NULL;
    }
    return slot_of_queue(slots, queue, topic, partition);
}

/* Whether ``payload`` (bytes, or any buffer) is one client batch (sole_batch.h): 1 with its
 * count, attributes and length set, 0 when not, -1 with an exception (not a buffer). */
static int sole_batch_of(PyObject *payload, int32_t *count, int16_t *attributes,
                         Py_ssize_t *size) {
    if (PyBytes_CheckExact(payload)) {
        *size = PyBytes_GET_SIZE(payload);
        return read_sole_batch((const unsigned char *)PyBytes_AS_STRING(payload), (size_t)*size,
                               count, attributes);
    }
    Py_buffer view;
    if (PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE) < 0) return -1;
    *size = view.len;
    int sole = read_sole_batch(view.buf, (size_t)view.len, count, attributes);
    PyBuffer_Release(&view);
    return sole;
}

/* One frame (held by the caller): 1 numbered (its records and bytes added to the totals), 0 not
 * on the main line, -1 with an exception. */
static int number_frame(Slots *slots, PyObject *queues, PyObject *frame, long long plain_from,
                        long long limit, long long *total_records, long long *total_bytes) {
    if (!PyTuple_Check(frame) || PyTuple_GET_SIZE(frame) < FRAME_FIELDS) return 0;
    long long offset = PyLong_AsLongLong(PyTuple_GET_ITEM(frame, 0));
    if (offset == -1 && PyErr_Occurred()) return -1;
    if (offset < plain_from) return 0;
    int32_t count;
    int16_t attributes;
    Py_ssize_t size;
    int sole = sole_batch_of(PyTuple_GET_ITEM(frame, 3), &count, &attributes, &size);
    if (sole <= 0) return sole;
    int stop = 0;
    Slot *slot = slot_for(slots, queues, frame, &stop);
    if (slot == NULL && !stop && !PyErr_Occurred()) {
        /* every slot taken: write them back, and start again with this frame's */
        if (write_back(slots) < 0) return -1;
        slot = slot_for(slots, queues, frame, &stop);
    }
    if (slot == NULL) return stop ? 0 : -1;
    if (number_one(slot->append, &slot->next, frame, count, attributes, limit) < 0) return -1;
    *total_records += count;
    *total_bytes += size;
    return 1;
}

static PyObject *number_sole_batches(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *frames, *queues;
    Py_ssize_t start;
    long long plain_from, limit;
    if (!PyArg_ParseTuple(args, "O!nO!LL", &PyList_Type, &frames, &start, &PyDict_Type, &queues,
                          &plain_from, &limit))
        return NULL;
    if (limit <= 0) {
        PyErr_SetString(PyExc_ValueError, "sequence_limit must be positive");
        return NULL;
    }
    Slots slots;
    slots.used = 0;
    long long total_records = 0, total_bytes = 0;
    Py_ssize_t index = start < 0 ? 0 : start;
    int numbered = 1;
    for (; index < PyList_GET_SIZE(frames); index++) {
        PyObject *frame = PyList_GET_ITEM(frames, index);
        Py_INCREF(frame); /* the list could change under an attribute's or an append's code */
        numbered = number_frame(&slots, queues, frame, plain_from, limit, &total_records,
                                &total_bytes);
        Py_DECREF(frame);
        if (numbered != 1) break;
    }
    if (numbered < 0) {
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        write_back(&slots); /* the frames numbered so far keep their numbers */
        PyErr_Restore(type, value, traceback);
        return NULL;
    }
    if (write_back(&slots) < 0) return NULL;
    return Py_BuildValue("(nLL)", index, total_records, total_bytes);
}

/* ------------------------------------------------------------------ taking a run to send */

/* The length of a Pending's batch (bytes, or a view of an older agent's frame): -1 with an
 * exception. */
static Py_ssize_t batch_length(PyObject *pending) {
    PyObject *batch = PyTuple_GET_ITEM(pending, 1);
    return PyBytes_CheckExact(batch) ? PyBytes_GET_SIZE(batch) : PyObject_Size(batch);
}

static int is_pending(PyObject *item) {
    if (PyTuple_CheckExact(item) && PyTuple_GET_SIZE(item) == PENDING_FIELDS) return 1;
    PyErr_SetString(PyExc_TypeError, "take_run takes a deque of Pending tuples");
    return 0;
}

/* take_run(frames, max_bytes, spare): PartitionQueue._take_run's merge run, as
 * partition_queue.take_run_python does it (the reference; test_take_run.py compares
 * the two): the first frame of the deque ``frames`` (taken whatever its size), then the
 * frames after it while their attributes are the first's and the merged size stays within
 * ``max_bytes`` (the first batch's length, and each next one's less ``spare``), each popped
 * from the deque's left. Returns (taken, batches, records, stored): the Pending tuples, their
 * batches, and the records and stored bytes they hold. The deque is walked with its iterator
 * before anything is popped (no deque is changed while iterated). */
static PyObject *take_run(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *frames;
    Py_ssize_t max_bytes, spare;
    if (!PyArg_ParseTuple(args, "Onn", &frames, &max_bytes, &spare)) return NULL;
    PyObject *iterator = PyObject_GetIter(frames);
    if (iterator == NULL) return NULL;
    PyObject *first = PyIter_Next(iterator);
    if (first == NULL) {
        Py_DECREF(iterator);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "take_run from an empty deque");
        return NULL;
    }
    Py_ssize_t count = 1, size = -1;
    long attributes = -1;
    if (is_pending(first)) {
        size = batch_length(first);
        attributes = PyLong_AsLong(PyTuple_GET_ITEM(first, 4));
    }
    Py_DECREF(first);
    while (size >= 0 && !(attributes == -1 && PyErr_Occurred())) {
        PyObject *candidate = PyIter_Next(iterator);
        if (candidate == NULL) break;
        Py_ssize_t length = is_pending(candidate) ? batch_length(candidate) : -1;
        long its = length < 0 ? -1 : PyLong_AsLong(PyTuple_GET_ITEM(candidate, 4));
        Py_DECREF(candidate);
        if (length < 0 || (its == -1 && PyErr_Occurred())) break;
        size += length - spare;
        if (size > max_bytes || its != attributes) break;
        count++;
    }
    Py_DECREF(iterator);
    if (PyErr_Occurred()) return NULL;
    PyObject *popleft = PyObject_GetAttr(frames, str_popleft);
    PyObject *taken = PyList_New(0), *batches = PyList_New(0);
    long long records = 0, stored = 0;
    int failed = popleft == NULL || taken == NULL || batches == NULL;
    for (Py_ssize_t i = 0; i < count && !failed; i++) {
        PyObject *pending = PyObject_CallNoArgs(popleft);
        if (pending == NULL || !is_pending(pending)) {
            Py_XDECREF(pending);
            failed = 1;
            break;
        }
        long long its_records = PyLong_AsLongLong(PyTuple_GET_ITEM(pending, 2));
        Py_ssize_t length = batch_length(pending);
        failed = (its_records == -1 && PyErr_Occurred()) || length < 0 ||
                 PyList_Append(taken, pending) < 0 ||
                 PyList_Append(batches, PyTuple_GET_ITEM(pending, 1)) < 0;
        Py_DECREF(pending);
        records += its_records;
        stored += length;
    }
    Py_XDECREF(popleft);
    if (failed) {
        Py_XDECREF(taken);
        Py_XDECREF(batches);
        return NULL;
    }
    return Py_BuildValue("(NNLL)", taken, batches, records, stored);
}

static PyMethodDef methods[] = {
    {"take_run", take_run, METH_VARARGS,
     "take_run(frames, max_bytes, spare) -> (taken, batches, records, stored): the frames "
     "PartitionQueue._take_run merges into one batch, popped from the deque's left, as "
     "partition_queue.take_run_python does."},
    {"number_sole_batches", number_sole_batches, METH_VARARGS,
     "number_sole_batches(frames, start, queues, plain_from, sequence_limit) -> (stop, "
     "records, bytes): number the main-line frames from start into their queues, as "
     "partition_queue.number_frames_python does."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_number_frames",
    "Number runs of WAL frames into partition queues (see the C source).", -1, methods,
};

PyMODINIT_FUNC PyInit__number_frames(void) {
    str_next_sequence = PyUnicode_InternFromString("next_sequence");
    str_frames = PyUnicode_InternFromString("frames");
    str_append = PyUnicode_InternFromString("append");
    str_popleft = PyUnicode_InternFromString("popleft");
    zero = PyLong_FromLong(0);
    if (str_next_sequence == NULL || str_frames == NULL || str_append == NULL ||
        str_popleft == NULL || zero == NULL)
        return NULL;
    return PyModule_Create(&module_def);
}
