/* Freed object arenas kept for reuse: CPython's small-object allocator without fresh pages.
 *
 * CPython serves every object of up to 512 bytes (tuples, ints, a one-record batch's bytes)
 * from arenas of 1 MiB it maps from the kernel, and it unmaps an arena as soon as its last
 * object is freed. The forwarder reads ahead thousands of frames (a tuple, an int and the
 * batch's bytes each), then frees them as Kafka acknowledges them: whole arenas went back to
 * the kernel and the next read mapped new ones, every page of them faulted in and zeroed
 * again (on the benchmark VMs a first touch runs at about 1 GB/s). That was about a third of
 * a one-record frame's forwarding work (docs/benchmarks.md).
 *
 * ``keep(max_bytes)`` puts this allocator in front of the interpreter's own: a freed arena is
 * held, up to ``max_bytes`` of them, and handed out again before a new one is mapped.
 * ``release()`` gives the held arenas back (the agent calls it after a burst, with
 * ``malloc_trim``). Arenas are allocated and freed under the GIL, as are these calls. Held
 * arenas made by the interpreter's allocator before ``keep`` go back through it: the cache
 * only defers the interpreter's own free.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define SLOTS 256 /* at most 256 MiB of 1 MiB arenas, whatever max_bytes says */

static PyObjectArenaAllocator interpreters; /* the allocator found when keep() first ran */
static int installed = 0;
static void *held[SLOTS];
static size_t held_size[SLOTS];
static int held_count = 0;
static size_t held_bytes = 0;
static size_t max_held_bytes = 0;

static void *arena_alloc(void *Py_UNUSED(context), size_t size) {
    /* The most recently freed arena of that size first: its pages are the likeliest cached. */
    for (int i = held_count - 1; i >= 0; i--) {
        if (held_size[i] != size) continue;
        void *arena = held[i];
        held_count--;
        held[i] = held[held_count];
        held_size[i] = held_size[held_count];
        held_bytes -= size;
        return arena;
    }
    return interpreters.alloc(interpreters.ctx, size);
}

static void arena_free(void *Py_UNUSED(context), void *arena, size_t size) {
    if (held_count < SLOTS && held_bytes + size <= max_held_bytes) {
        held[held_count] = arena;
        held_size[held_count] = size;
        held_count++;
        held_bytes += size;
        return;
    }
    interpreters.free(interpreters.ctx, arena, size);
}

static size_t release_held(void) {
    size_t released = held_bytes;
    while (held_count > 0) {
        held_count--;
        interpreters.free(interpreters.ctx, held[held_count], held_size[held_count]);
    }
    held_bytes = 0;
    return released;
}

static PyObject *keep(PyObject *Py_UNUSED(module), PyObject *args) {
    Py_ssize_t max_bytes;
    if (!PyArg_ParseTuple(args, "n", &max_bytes)) return NULL;
    if (max_bytes < 0) {
        PyErr_Format(PyExc_ValueError, "max_bytes %zd is negative", max_bytes);
        return NULL;
    }
    if (!installed) {
        PyObject_GetArenaAllocator(&interpreters);
        PyObjectArenaAllocator ours = {NULL, arena_alloc, arena_free};
        PyObject_SetArenaAllocator(&ours);
        installed = 1;
    }
    if ((size_t)max_bytes < held_bytes) release_held();
    max_held_bytes = (size_t)max_bytes;
    Py_RETURN_NONE;
}

static PyObject *release(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(args)) {
    return PyLong_FromSize_t(release_held());
}

static PyObject *held_now(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(args)) {
    return PyLong_FromSize_t(held_bytes);
}

static PyMethodDef methods[] = {
    {"keep", keep, METH_VARARGS,
     "keep(max_bytes): hold up to max_bytes of freed arenas for reuse (installs the cache)."},
    {"release", release, METH_NOARGS, "release() -> bytes: give every held arena back."},
    {"held", held_now, METH_NOARGS, "held() -> bytes of freed arenas held now."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_arena_cache", "Freed object arenas kept for reuse.", -1, methods,
};

PyMODINIT_FUNC PyInit__arena_cache(void) { return PyModule_Create(&module); }
