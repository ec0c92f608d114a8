"""One lock per DurableProducer: claims and pool changes of one producer take turns.

Within this process only; across processes (every operator replica serves the webhook and
claims volumes) the API server's resourceVersion preconditions keep concurrent claims apart
(see volume_pool.py).
"""

from __future__ import annotations

import threading

_producer_locks: dict[tuple[str, str], threading.Lock] = {}
_producer_locks_lock = threading.Lock()


def producer_lock(namespace: str, name: str) -> threading.Lock:
    with _producer_locks_lock:
        return _producer_locks.setdefault((namespace, name), threading.Lock())
