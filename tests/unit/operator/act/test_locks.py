"""The per-DurableProducer lock: the webhook waits for it only the time it has left (D5)."""

from __future__ import annotations

import threading
import time

import pytest

from durable_producer.operator.act.locks import (
    ProducerBusy,
    holding_producer_lock,
    producer_lock,
)


def test_a_lock_held_elsewhere_is_given_up_on_after_the_timeout() -> None:
    lock = producer_lock("shop", "busy")
    lock.acquire()
    try:
        started = time.monotonic()
        with (
            pytest.raises(ProducerBusy, match="shop/busy stayed busy"),
            holding_producer_lock("shop", "busy", 0.2),
        ):
            pass
        assert 0.15 < time.monotonic() - started < 3.0
    finally:
        lock.release()


def test_no_time_left_means_no_wait() -> None:
    lock = producer_lock("shop", "none-left")
    with lock, pytest.raises(ProducerBusy), holding_producer_lock("shop", "none-left", -1.0):
        pass


def test_the_lock_is_held_inside_and_released_after_even_on_error() -> None:
    with pytest.raises(RuntimeError), holding_producer_lock("shop", "orders", 1.0):
        assert producer_lock("shop", "orders").locked()
        raise RuntimeError("boom")
    assert not producer_lock("shop", "orders").locked()


def test_without_a_timeout_it_waits_until_the_lock_is_free() -> None:
    lock = producer_lock("shop", "timer")
    lock.acquire()
    threading.Timer(0.2, lock.release).start()
    with holding_producer_lock("shop", "timer", None):
        assert lock.locked()
