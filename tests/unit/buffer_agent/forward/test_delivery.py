"""Frames settle from their delivery reports exactly when every record is accounted for.

A stand-in producer records the produce calls (and raises where a test says so); the
tests then play the delivery reports by calling the callbacks the ledger attached.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from durable_producer.buffer_agent.forward.ack_tracker import AckTracker
from durable_producer.buffer_agent.forward.delivery import (
    DeliveryLedger,
    DeliveryMode,
    FrameDelivery,
)
from durable_producer.buffer_agent.forward.replay_accounting import ReplayAccount
from durable_producer.buffer_agent.wal import Frame
from support.batch_builder import SampleRecord, build_batch

TOPIC = "orders"
CALLBACK = 4  # position of the delivery callback in a produce call


class _Failures:
    """Records what the ledger hands on (the ``FailureHandling`` protocol)."""

    def __init__(self) -> None:
        self.dead_lettered: dict[int, set[int]] = {}
        self.records: list[tuple[int, int, int, bool]] = []
        self.groups: list[tuple[int, int]] = []
        self.frames: list[int] = []
        self.after_reset: list[int] = []

    def record_failed(
        self, delivery: FrameDelivery, index: int, error: KafkaError, *, synchronous: bool = False
    ) -> None:
        self.records.append((delivery.offset, index, error.code(), synchronous))

    def group_failed(self, delivery: FrameDelivery, error: KafkaError) -> None:
        self.groups.append((delivery.offset, error.code()))

    def refused_after_reset(self, error: KafkaError) -> None:
        self.after_reset.append(error.code())

    def dead_letter_frame(
        self, frame: Frame, reason: str, generation: int, settle: Callable[[], None]
    ) -> None:
        self.frames.append(frame.offset)
        settle()


class _Producer:
    """Keeps each produce call; ``refuse`` maps a record value to the error produce() raises;
    ``full`` raises BufferError that many times first."""

    def __init__(self, refuse: dict[bytes, int] | None = None, full: int = 0) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.refuse = refuse or {}
        self.full = full

    def produce(self, *call: Any) -> None:
        if self.full:
            self.full -= 1
            raise BufferError
        if call[1] in self.refuse:
            raise KafkaException(KafkaError(self.refuse[call[1]]))
        self.calls.append(call)

    def report(self, index: int, error: KafkaError | None = None) -> None:
        callback: Callable[[KafkaError | None, Any], None] | None = self.calls[index][CALLBACK]
        assert callback is not None, f"call {index} asked for no report"
        callback(error, None)


def _frame(offset: int, records: int, partition: int = 0) -> Frame:
    batch = build_batch(
        [SampleRecord(b"k", b"%d/%d" % (offset, index), 1_000 + index) for index in range(records)]
    )
    return Frame(offset, TOPIC, partition, batch, records, appended_ms=5)


def _ledger() -> tuple[DeliveryLedger, _Failures]:
    failures = _Failures()
    return DeliveryLedger(AckTracker(0), failures), failures


def _produce(
    ledger: DeliveryLedger,
    frame: Frame,
    producer: _Producer,
    *,
    sparse: bool = True,
    wait_for_room: Callable[[], bool] = lambda: True,
) -> int:
    return ledger.produce_frame(
        frame,
        producer,  # type: ignore[arg-type]
        sparse=sparse,
        wait_for_room=wait_for_room,
    )


def test_sparse_mode_asks_one_report_per_frame_and_it_settles_the_frame() -> None:
    ledger, _ = _ledger()
    producer = _Producer()

    assert _produce(ledger, _frame(0, 4), producer) == 4
    assert [call[CALLBACK] is None for call in producer.calls] == [True, True, True, False]
    assert ledger.tracker.watermark == 0 and ledger.tracker.pending_records == 4

    producer.report(3)

    assert ledger.tracker.watermark == 1 and ledger.tracker.idle
    assert (ledger.forwarded_records, ledger.sparse_records, ledger.careful_records) == (4, 4, 0)
    assert ledger.forwarded_bytes == len(_frame(0, 4).payload)


def test_careful_mode_settles_a_frame_once_every_record_reported() -> None:
    ledger, failures = _ledger()
    producer = _Producer()
    _produce(ledger, _frame(0, 3), producer, sparse=False)

    producer.report(0)
    producer.report(2)
    assert ledger.tracker.watermark == 0
    producer.report(1, KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))

    assert failures.records == [(0, 1, KafkaError.MSG_SIZE_TOO_LARGE, False)]
    assert ledger.tracker.watermark == 0, "the failed record is not settled by its report"
    assert ledger.careful_records == 0


def test_a_failed_sparse_report_is_handed_on_as_a_group_failure() -> None:
    ledger, failures = _ledger()
    producer = _Producer()
    _produce(ledger, _frame(0, 3), producer)

    producer.report(2, KafkaError(KafkaError._PURGE_QUEUE))

    assert failures.groups == [(0, KafkaError._PURGE_QUEUE)]
    assert ledger.tracker.watermark == 0


def test_a_refused_reporting_record_is_vouched_for_by_the_next_success_on_its_partition() -> None:
    ledger, failures = _ledger()
    producer = _Producer(refuse={b"0/2": KafkaError.MSG_SIZE_TOO_LARGE})
    _produce(ledger, _frame(0, 3), producer)
    assert failures.records == [(0, 2, KafkaError.MSG_SIZE_TOO_LARGE, True)]
    assert (TOPIC, 0) in ledger.orphans
    orphan = ledger.orphans[(TOPIC, 0)][0]
    orphan.settle_one()  # what dead-lettering the refused record does

    _produce(ledger, _frame(1, 2, partition=1), producer)
    producer.report(len(producer.calls) - 1)  # another partition vouches for nothing
    assert ledger.tracker.watermark == 0

    _produce(ledger, _frame(2, 2), producer)
    producer.report(len(producer.calls) - 1)

    assert not ledger.orphans
    assert ledger.tracker.watermark == 3 and ledger.tracker.idle


def test_reports_of_a_disowned_generation_settle_nothing() -> None:
    ledger, failures = _ledger()
    producer = _Producer()
    _produce(ledger, _frame(0, 2), producer)

    ledger.disown_reports()
    producer.report(1)
    producer.report(1, KafkaError(KafkaError._PURGE_QUEUE))

    assert ledger.tracker.watermark == 0 and ledger.forwarded_records == 0
    assert failures.groups == []
    assert failures.after_reset == [KafkaError._PURGE_QUEUE]  # handed on, to be counted


def test_a_refusal_reported_after_a_reset_is_handed_on_to_be_counted() -> None:
    """The records settle nothing (their frame is replayed), but Kafka did refuse them."""
    ledger, failures = _ledger()
    producer = _Producer()
    _produce(ledger, _frame(0, 2), producer, sparse=False)

    ledger.disown_reports()
    producer.report(0, KafkaError(KafkaError.INVALID_PRODUCER_EPOCH))

    assert failures.records == []
    assert failures.after_reset == [KafkaError.INVALID_PRODUCER_EPOCH]


def test_records_dead_lettered_before_a_reset_are_not_produced_again() -> None:
    ledger, failures = _ledger()
    failures.dead_lettered[0] = {1}
    producer = _Producer()

    assert _produce(ledger, _frame(0, 3), producer) == 2
    assert [call[1] for call in producer.calls] == [b"0/0", b"0/2"]
    producer.report(1)

    assert ledger.tracker.watermark == 1
    assert ledger.forwarded_records == 2, "the dead-lettered record is not counted forwarded"


def test_a_full_client_queue_waits_for_room_or_gives_the_frame_up() -> None:
    ledger, _ = _ledger()
    waits: list[bool] = []

    def wait(carry_on: bool) -> Callable[[], bool]:
        def wait_for_room() -> bool:
            waits.append(carry_on)
            return carry_on

        return wait_for_room

    patient = _Producer(full=2)
    assert _produce(ledger, _frame(0, 3), patient, wait_for_room=wait(True)) == 3
    assert len(patient.calls) == 3 and waits == [True, True]

    given_up = _Producer(full=1)
    assert _produce(ledger, _frame(1, 3), given_up, wait_for_room=wait(False)) == 0
    assert given_up.calls == []
    assert ledger.tracker.next_offset == 2, "registered: it stays above the watermark"


def test_an_undecodable_frame_is_dead_lettered_and_settled() -> None:
    ledger, failures = _ledger()
    frame = Frame(0, TOPIC, 0, b"not a record batch", 1, appended_ms=5)

    assert _produce(ledger, frame, _Producer()) == 0

    assert failures.frames == [0]
    assert ledger.tracker.watermark == 1


def test_records_of_frames_below_the_replay_mark_count_as_possible_duplicates() -> None:
    ledger, _ = _ledger()
    ledger.replay = ReplayAccount(until=1)  # a previous run sent frame 0, outcome unknown
    producer = _Producer()

    _produce(ledger, _frame(0, 3), producer)
    _produce(ledger, _frame(1, 2), producer)

    assert ledger.replay.possible_duplicates == 3
    assert ledger.replay.certain_duplicates == 0


def test_start_over_forgets_orphans_and_tracks_from_the_watermark() -> None:
    ledger, _ = _ledger()
    _produce(ledger, _frame(0, 2), _Producer(refuse={b"0/1": KafkaError.INVALID_RECORD}))
    assert ledger.orphans

    ledger.start_over(0)

    assert not ledger.orphans
    assert ledger.tracker.idle and ledger.tracker.next_offset == 0


def test_a_reset_request_keeps_its_first_reason_and_makes_the_mode_careful() -> None:
    mode = DeliveryMode()
    mode.request_reset("first")
    mode.request_reset("second", isolate=True)

    assert mode.enter_careful(in_flight_until=40) == "first"

    assert mode.careful and mode.isolate and mode.isolating
    assert mode.careful_until == 40 and mode.reset_reason is None


def test_isolating_lasts_until_the_mode_is_sparse_again() -> None:
    mode = DeliveryMode()
    mode.request_reset("batch refused", isolate=True)
    mode.enter_careful(in_flight_until=10)
    mode.request_reset("fatal error")  # no isolation asked this time
    mode.enter_careful(in_flight_until=5)

    assert mode.isolating, "still careful: stays isolating"
    assert mode.careful_until == 10, "never moves back"

    mode.leave_careful()
    assert not mode.careful and not mode.isolating
    mode.request_reset("again")
    mode.enter_careful(in_flight_until=12)
    assert mode.careful and not mode.isolate
