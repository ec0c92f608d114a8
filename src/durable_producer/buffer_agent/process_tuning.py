"""Process-wide tuning the agent applies once it serves: the allocator and the garbage collector.

Benchmarks apply the same (``prepare_to_serve``) so they measure what the agent runs.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import platform
from types import ModuleType

log = logging.getLogger(__name__)

_arenas: ModuleType | None
try:  # built from _arena_cache.c by the package's build (optional: needs a C compiler)
    from . import _arena_cache as _arenas
except ImportError:
    _arenas = None

RETAINED_FREE_HEAP_BYTES = 64 << 20
"""Free heap glibc keeps for reuse before it returns pages to the kernel."""
RETAINED_FREE_ARENA_BYTES = 64 << 20
"""Freed arenas of CPython's small-object allocator (1 MiB each) kept for reuse
(``keep_freed_arenas``): about what the forwarder's read-ahead of one-record frames fills."""
HEAP_ALLOCATION_LIMIT_BYTES = 16 << 20
"""Blocks up to this size (every produce request the default limits allow) come from the heap."""
TRIM_AFTER_PEAK_BYTES = 16 << 20
"""Bytes since the last ``release_free_memory`` that make the next quiet moment release
again: the ingest's request-memory peak, the stored batches the forwarder delivered."""
TRIM_INTERVAL_S = 10.0
"""At most one ``release_free_memory`` this often, per caller."""
YOUNG_COLLECTION_THRESHOLD = 10_000
"""Allocations of collectable objects, less their frees, between two collections of the
young generation (CPython's default: 700). ``collect_less_often`` says why."""
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def prepare_to_serve() -> None:
    """Process-wide settings applied once the agent serves (benchmarks apply them too)."""
    if not keep_freed_memory():
        log.info("not a glibc process: freed request buffers go back to the allocator's default")
    if not keep_freed_arenas():
        log.info("no _arena_cache module (built without a C compiler): freed arenas are unmapped")
    freeze_startup_heap()
    collect_less_often()


def keep_freed_memory() -> bool:
    """Make glibc reuse freed request buffers instead of handing their pages back.

    Every produce request is received into a buffer of its own (about 1 MB under load, see
    ``frame_receiver``). With glibc's defaults most of those buffers were fresh pages: it
    trims a heap whose top is 2 MB free and maps larger blocks separately. A page fault for
    each 4 KiB made a 1 MB buffer cost ~0.4 ms on the benchmark VMs, a third of the event
    loop's busy time at 200 B records. The cost: up to RETAINED_FREE_HEAP_BYTES of freed heap
    stays in the process (it is reused, and it counts in the container's memory). False where
    the C library is not glibc (musl has no such knobs).
    """
    if platform.libc_ver()[0] != "glibc":
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(
        mallopt(_M_MMAP_THRESHOLD, HEAP_ALLOCATION_LIMIT_BYTES)
        and mallopt(_M_TRIM_THRESHOLD, RETAINED_FREE_HEAP_BYTES)
    )


def keep_freed_arenas() -> bool:
    """Make CPython reuse the arenas of small objects it frees instead of unmapping them.

    CPython serves every object of up to 512 bytes from 1 MiB arenas and unmaps an arena once
    its last object is freed. The forwarder reads ahead thousands of one-record frames (a
    tuple, an int and the batch's bytes each) and frees them as Kafka acknowledges them:
    whole arenas went back to the kernel, and the next read faulted every page of new ones in
    again, about a third of a one-record frame's forwarding work on the benchmark VMs
    (docs/benchmarks.md). The cost: up to RETAINED_FREE_ARENA_BYTES of freed arenas stay in
    the process until ``release_free_memory``. False without the compiled ``_arena_cache``.
    """
    if _arenas is None:
        return False
    _arenas.keep(RETAINED_FREE_ARENA_BYTES)
    return True


def release_free_memory() -> bool:
    """Hand free memory back to the kernel now: the freed arenas ``keep_freed_arenas`` holds,
    and free heap pages (glibc's ``malloc_trim``).

    ``keep_freed_memory`` makes glibc keep freed request buffers for reuse; after a burst
    that will not come back (hundreds of connections closed, a request-memory peak; the
    forwarder's read-ahead after a catch-up) the ingest and the forwarder call this so the
    process returns near its baseline. False where the C library is not glibc (the arenas
    are released all the same).
    """
    if _arenas is not None:
        _arenas.release()
    if platform.libc_ver()[0] != "glibc":
        return False
    ctypes.CDLL(None).malloc_trim(0)
    return True


def freeze_startup_heap() -> None:
    """Exempt everything allocated so far from the cyclic garbage collector.

    Called once the agent serves: modules, kio schemas and the restored producer state live
    as long as the process, and a full collection scanning them stalled the event loop for
    ~20 ms (it was the p99 of produce latency in benchmarks/ingest_bench.py). Afterwards a
    collection scans only what serving allocated.
    """
    gc.collect()
    gc.freeze()


def collect_less_often() -> None:
    """Collect the young generation every ``YOUNG_COLLECTION_THRESHOLD`` allocations, not 700.

    The forwarder makes a tuple for every stored batch it reads ahead (100,000 one-record
    frames of a ``linger.ms=0`` client at most). They are untracked at once, as no cycle can
    go through them, but CPython counts each as an allocation until it is freed: at 700 the
    forwarder ran a young collection every 700 frames it read, a middle one every 7,000 and
    a full one, which walks every queued frame, every 60,000 or so. Against Apache Kafka that
    was 115-163 ms of the forwarding thread per million one-record frames, 58-74 ms at 10,000
    (docs/benchmarks.md). A young collection then walks at most that many new objects (about
    0.3 ms measured), well below the full collections ``freeze_startup_heap`` keeps off the
    ingest's latency; the older generations keep their thresholds.
    """
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, middle, old)
