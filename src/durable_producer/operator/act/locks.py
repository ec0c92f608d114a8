"""One lock per DurableProducer: claims and pool changes of one producer take turns.

Within this process only; across processes (every operator replica serves the webhook and
claims volumes) the API server's resourceVersion preconditions keep concurrent claims apart
(see volume_pool.py). The lock only spares this process's own claims and pool writes the
409s of racing each other; correctness never rests on it.

The admission webhook waits for it no longer than its deadline has left (D5): a pool run
or other claims holding it past that refuse the pod (retryable), never hang it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

_producer_locks: dict[tuple[str, str], threading.Lock] = {}
_producer_locks_lock = threading.Lock()


class ProducerBusy(TimeoutError):
    """The DurableProducer's lock could not be had in the time given."""


def producer_lock(namespace: str, name: str) -> threading.Lock:
    with _producer_locks_lock:
        return _producer_locks.setdefault((namespace, name), threading.Lock())


@contextlib.contextmanager
def holding_producer_lock(namespace: str, name: str, timeout: float | None) -> Iterator[None]:
    """Hold the producer's lock; wait at most ``timeout`` seconds for it (None: as long as
    it takes), else raise ProducerBusy."""
    lock = producer_lock(namespace, name)
    if not lock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
        raise ProducerBusy(
            f"DurableProducer {namespace}/{name} stayed busy (its volume pool is being changed"
            f" by other claims or the pool timer) for the {timeout:.1f}s left"
        )
    try:
        yield
    finally:
        lock.release()
