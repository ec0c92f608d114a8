"""Re-sending a letter of the per-record forwarder of earlier versions: the one record it
holds becomes a v2 batch that decodes to that record (key, value, headers, timestamp), null
fields and negative numbers included. The batches of today's letters are re-sent as they were
stored (tests/integration/buffer_agent/forward/test_forwarder.py)."""

from __future__ import annotations

import asyncio
import errno
import json
from pathlib import Path

import pytest

from durable_producer.buffer_agent.forward import resend
from durable_producer.buffer_agent.forward.dead_letter import (
    RESENT_FILE,
    TAKEN_FILE,
    DeadLetter,
    DeadLetterStore,
    list_dead_letters,
    read_dead_letters,
)
from durable_producer.buffer_agent.forward.resend import _batches_of
from durable_producer.buffer_agent.kafka.record_batch import parse_batch_header
from durable_producer.buffer_agent.kafka.record_decode import decode_batch
from support.batch_builder import SampleRecord, build_batch
from support.dead_letters import refused


def letter(**fields: object) -> DeadLetter:
    base: dict[str, object] = {
        "id": "9-0",
        "recorded_ms": 1,
        "wal_offset": 9,
        "topic": "orders",
        "partition": 0,
        "record_index": 0,
        "reason": "refused",
        "error_code": "MESSAGE_TOO_LARGE",
    }
    return DeadLetter(**(base | fields))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("key", "value", "headers", "timestamp"),
    [
        (b"k", b"v" * 300, (("h", b"x"), ("nul\x00key", None)), 1_700_000_000_123),
        (None, None, (), 0),
        (b"", b"", (("", b""),), None),
        (b"k" * 70_000, b"v", tuple((f"h{i}", b"y" * i) for i in range(200)), 5),
    ],
)
def test_an_earlier_agents_letter_is_sent_as_the_record_it_holds(
    key: bytes | None,
    value: bytes | None,
    headers: tuple[tuple[str, bytes | None], ...],
    timestamp: int | None,
) -> None:
    old = letter(key=key, value=value, headers=headers, timestamp_ms=timestamp)
    [(batch, count)] = _batches_of(old)
    assert count == 1
    decoded = decode_batch(bytes(batch), fast=False)
    assert decoded.header.record_count == 1
    [record] = decoded.records
    assert (record.key, record.value) == (key, value)
    assert [(name, data) for name, data in record.headers] == list(headers)
    assert record.timestamp_ms == (-1 if timestamp is None else timestamp)
    assert decode_batch(bytes(batch)).records == decoded.records  # the compiled decoder agrees


class _Cluster:
    """Stands in for ``ClusterClient``: this test is about the summary's bookkeeping when the
    cluster goes away between two letters, which a real broker cannot be made to do at that
    exact point (the sending itself is tested against Apache Kafka in test_forwarder.py)."""

    leaders = {("orders", 2): 1}
    topic_errors: dict[str, int] = {}

    async def refresh(self, topics: object) -> None:
        return None

    async def init_producer_id(self) -> tuple[int, int]:
        return 7, 0

    def close(self) -> None:
        return None


def test_a_letter_of_an_id_already_re_sent_that_kafka_never_took_is_reported_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two pending letters of one id (a WAL made again numbers from 0): the first went, then
    Kafka was lost. The second was reported neither re-sent nor failed, and resend exited 0."""
    directory = tmp_path / "dead-letter"
    store = DeadLetterStore(directory)
    store.add_batches([refused(7, build_batch([SampleRecord(b"k", b"old", 1)]))])
    store.add_batches([refused(7, build_batch([SampleRecord(b"k", b"new", 2)]))])
    sent = []

    async def send_one(client: object, leader: int, key: object, parts: object, t: float) -> int:
        if sent:
            raise OSError("connection reset")
        sent.append(parts)
        return 0

    monkeypatch.setattr(resend.ClusterClient, "for_config", lambda *a, **k: _Cluster())
    monkeypatch.setattr(resend, "_send_one", send_one)
    summary = resend.resend_dead_letters(directory, {"bootstrap.servers": "unused:9092"})
    assert summary.resent == ["7-0"]
    assert summary.failed == [("7-0", "Kafka unreachable: connection reset")]
    assert [letter.payload for letter in list_dead_letters(directory)] == [
        build_batch([SampleRecord(b"k", b"new", 2)])
    ]


def test_two_letters_of_one_id_that_both_fail_are_two_failures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The summary counts letters, not ids: two letters of id 7-0 refused again were reported
    as one failure ("failed 1") when the summary was keyed by id."""
    directory = tmp_path / "dead-letter"
    store = DeadLetterStore(directory)
    store.add_batches([refused(7, build_batch([SampleRecord(b"k", b"old", 1)]))])
    store.add_batches([refused(7, build_batch([SampleRecord(b"k", b"new", 2)]))])

    async def send_one(client: object, leader: int, key: object, parts: object, t: float) -> int:
        return MESSAGE_TOO_LARGE

    monkeypatch.setattr(resend.ClusterClient, "for_config", lambda *a, **k: _Cluster())
    monkeypatch.setattr(resend, "_send_one", send_one)
    summary = resend.resend_dead_letters(directory, {"bootstrap.servers": "unused:9092"})
    assert (summary.resent, summary.failed) == ([], [("7-0", "MESSAGE_TOO_LARGE")] * 2)
    assert len(list_dead_letters(directory)) == 2, "both stay pending"


MESSAGE_TOO_LARGE = 10
REQUEST_TIMED_OUT = 7


class _Leader:
    """What a partition leader does with an idempotent producer's batches, as far as these
    tests need: a batch repeating a sequence it appended is answered NONE and not stored
    again (a copy). ``answers`` are given to the first sends instead of NONE; a batch
    answered REQUEST_TIMED_OUT is appended all the same (as Kafka's leader does when its
    followers do not confirm in time). A real broker cannot be made to answer so at one
    chosen request of a run: hence this stand-in."""

    def __init__(self, *answers: int) -> None:
        self.answers = list(answers)
        self.stored: list[bytes] = []
        self.sequences: set[int] = set()

    async def send_one(
        self, client: object, leader: int, key: object, parts: list[bytes], t: float
    ) -> int:
        batch = b"".join(bytes(part) for part in parts)
        sequence = parse_batch_header(batch).base_sequence
        code = self.answers.pop(0) if self.answers else 0
        if sequence in self.sequences:
            return 0  # a copy of a batch it holds
        if code in (0, REQUEST_TIMED_OUT):
            self.sequences.add(sequence)
            self.stored.append(batch)
        return code


def _two_letters(tmp_path: Path) -> Path:
    directory = tmp_path / "dead-letter"
    store = DeadLetterStore(directory)
    store.add_batches([refused(7, build_batch([SampleRecord(b"k", b"first", 1)]))])
    store.add_batches([refused(8, build_batch([SampleRecord(b"k", b"second", 2)]))])
    return directory


def test_after_an_answer_that_leaves_a_letter_in_kafka_or_not_its_partition_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """REQUEST_TIMED_OUT: the leader appended the first letter. The second went under the
    same sequence, was taken for its copy (NONE) and marked re-sent, its record never
    stored."""
    directory = _two_letters(tmp_path)
    leader = _Leader(REQUEST_TIMED_OUT)
    monkeypatch.setattr(resend.ClusterClient, "for_config", lambda *a, **k: _Cluster())
    monkeypatch.setattr(resend, "_send_one", leader.send_one)
    summary = resend.resend_dead_letters(directory, {"bootstrap.servers": "unused:9092"})
    assert summary.resent == []
    assert summary.failed[0] == ("7-0", "REQUEST_TIMED_OUT")
    assert summary.failed[1][0] == "8-0"
    assert "not sent: letter 7-0 before it may be in Kafka" in summary.failed[1][1]
    assert len(list_dead_letters(directory)) == 2, "both stay pending"
    assert len(leader.stored) == 1


def test_after_a_refusal_kafka_did_not_append_the_next_letter_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MESSAGE_TOO_LARGE: nothing appended, so the next letter takes the sequence."""
    directory = _two_letters(tmp_path)
    leader = _Leader(MESSAGE_TOO_LARGE)
    monkeypatch.setattr(resend.ClusterClient, "for_config", lambda *a, **k: _Cluster())
    monkeypatch.setattr(resend, "_send_one", leader.send_one)
    summary = resend.resend_dead_letters(directory, {"bootstrap.servers": "unused:9092"})
    assert (summary.resent, summary.failed) == (["8-0"], [("7-0", "MESSAGE_TOO_LARGE")])
    assert [decode_batch(b).records[0].value for b in leader.stored] == [b"second"]


def test_a_letter_kafka_never_answered_says_how_long_it_waited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reason read "Kafka unreachable: " (a TimeoutError has no message)."""
    directory = _two_letters(tmp_path)

    async def send_one(client: object, leader: int, key: object, parts: object, t: float) -> int:
        raise TimeoutError

    monkeypatch.setattr(resend.ClusterClient, "for_config", lambda *a, **k: _Cluster())
    monkeypatch.setattr(resend, "_send_one", send_one)
    summary = resend.resend_dead_letters(directory, {"bootstrap.servers": "x:9092"}, timeout=10)
    waited = "no answer from Kafka within 15 s"
    assert summary.failed == [("7-0", waited), ("8-0", waited)]


def test_a_letter_sent_whose_mark_cannot_be_written_says_so_and_the_run_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was reported "Kafka unreachable: [Errno 28] ...", with every letter after it, though
    Kafka had taken it: a user would send it again, and it would be stored twice. The full
    disk is a raising ``mark_resent`` here (the store's own full-disk behaviour is tested on
    a real small filesystem in test_dead_letter_disk_full.py)."""
    directory = _two_letters(tmp_path)
    leader = _Leader()

    def no_room(self: DeadLetterStore, letter: DeadLetter) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(resend.ClusterClient, "for_config", lambda *a, **k: _Cluster())
    monkeypatch.setattr(resend, "_send_one", leader.send_one)
    monkeypatch.setattr(DeadLetterStore, "mark_resent", no_room)
    summary = resend.resend_dead_letters(directory, {"bootstrap.servers": "x:9092"})
    assert summary.resent == []
    [(first, why), (second, then)] = summary.failed
    assert (first, second) == ("7-0", "8-0")
    assert why.startswith("sent to Kafka, but its re-sent mark could not be written (No space")
    assert "leave it out of the next resend" in why
    assert then == "not sent: the re-sent mark of letter 7-0 could not be written"
    assert len(leader.stored) == 1


@pytest.mark.parametrize(
    "fields",
    [{"timestamp_ms": 2**63}, {"headers": (("\ud800", b"x"),)}],
    ids=["timestamp-beyond-int64", "lone-surrogate-header-key"],
)
def test_an_earlier_agents_letter_that_cannot_be_encoded_is_skipped_and_the_rest_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fields: dict[str, object]
) -> None:
    """Such a line (edited by hand: an agent never wrote one) ended the whole run with a
    traceback (OverflowError, UnicodeEncodeError)."""
    bad = letter(id="1-0", partition=2, key=b"k", value=b"v", **fields)
    good = letter(id="2-0", partition=2, key=b"k", value=b"w", timestamp_ms=5)
    leader = _Leader()

    class Store:
        def mark_resent(self, letter: DeadLetter) -> None:
            return None

        def mark_taken(self, letter: DeadLetter, batches: int) -> None:
            return None

    monkeypatch.setattr(resend.ClusterClient, "for_config", lambda *a, **k: _Cluster())
    monkeypatch.setattr(resend, "_send_one", leader.send_one)
    summary = resend.ResendSummary()
    asyncio.run(resend._resend(Store(), [bad, good], {}, 5.0, summary))  # type: ignore[arg-type]
    assert summary.resent == ["2-0"]
    assert [(id_, why.split(":")[0]) for id_, why in summary.skipped] == [
        ("1-0", "its record cannot be encoded")
    ]


def _run(letters: list[DeadLetter], send_one: object) -> resend.ResendSummary:
    class Store:
        def mark_resent(self, letter: DeadLetter) -> None:
            return None

        def mark_taken(self, letter: DeadLetter, batches: int) -> None:
            return None

    summary = resend.ResendSummary()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(resend.ClusterClient, "for_config", lambda *a, **k: _Cluster())
        patch.setattr(resend, "_send_one", send_one)
        asyncio.run(resend._resend(Store(), letters, {}, 5.0, summary))  # type: ignore[arg-type]
    return summary


def test_a_letter_holding_no_batch_is_skipped_not_marked_re_sent() -> None:
    """A hand-edited line with an empty payload was marked re-sent with nothing sent."""
    summary = _run([letter(partition=2, payload=b"")], _Leader().send_one)
    assert (summary.resent, summary.skipped) == ([], [("9-0", "holds no record batch")])


def test_a_letter_whose_first_batches_kafka_took_says_so() -> None:
    """An older agent's letter of two batches, the first taken and the second refused."""
    two = build_batch([SampleRecord(b"k", b"a", 1)]) + build_batch([SampleRecord(b"k", b"b", 2)])
    summary = _run([letter(partition=2, payload=two)], _Leader(0, MESSAGE_TOO_LARGE).send_one)
    assert summary.failed == [
        ("9-0", "MESSAGE_TOO_LARGE; Kafka took its first 1 of 2 batches: a resend sends the rest")
    ]


@pytest.mark.parametrize("fault", ["refused", "unreachable"])
def test_a_resend_of_a_letter_taken_in_part_sends_only_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """The first of three batches taken, the second refused (or the connection lost): the
    next resend sent all three, and Kafka stored the first twice."""
    directory = tmp_path / "dead-letter"
    batches = [build_batch([SampleRecord(b"k", value, 1)]) for value in (b"a", b"b", b"c")]
    DeadLetterStore(directory).add_batches([refused(7, b"".join(batches))])
    sent: list[bytes] = []
    faulty = [True]  # the first resend's second send fails

    async def send_one(client: object, leader: int, key: object, parts: object, t: float) -> int:
        if faulty[0] and len(sent) == 1:
            if fault == "unreachable":
                raise OSError("connection reset")
            return MESSAGE_TOO_LARGE
        sent.append(bytes(parts[1]))  # type: ignore[index]  # the records after the header
        return 0

    monkeypatch.setattr(resend.ClusterClient, "for_config", lambda *a, **k: _Cluster())
    monkeypatch.setattr(resend, "_send_one", send_one)
    config = {"bootstrap.servers": "unused:9092"}
    first = resend.resend_dead_letters(directory, config)
    [(_, why)] = first.failed
    assert first.resent == []
    assert why.endswith("Kafka took its first 1 of 3 batches: a resend sends the rest")
    [pending] = list_dead_letters(directory)
    assert pending.taken_batches == 1
    assert not (directory / RESENT_FILE).exists(), "older agents read only resent.jsonl"
    faulty[0] = False
    second = resend.resend_dead_letters(directory, config)
    assert (second.resent, second.failed) == (["7-0"], [])
    assert sent == [batch[61:] for batch in batches], "each batch once, in order"
    assert list_dead_letters(directory) == []


@pytest.mark.parametrize("batches", [0, -1, "1", None])
def test_a_taken_mark_that_names_no_batch_is_damage(
    tmp_path: Path, batches: object
) -> None:
    """Listed as an unreadable line; the letter stays pending, with nothing taken."""
    directory = tmp_path / "dead-letter"
    DeadLetterStore(directory).add_batches([refused(7, build_batch([SampleRecord(b"k", b"a", 1)]))])
    [letter] = list_dead_letters(directory)
    mark = {"id": letter.id, "recorded_ms": letter.recorded_ms, "batches": batches}
    (directory / TAKEN_FILE).write_text(json.dumps(mark) + "\n")
    reading = read_dead_letters(directory)
    assert reading.unreadable == [f"{TAKEN_FILE} line 1"]
    assert [pending.taken_batches for pending in reading.letters] == [0]


def test_a_taken_mark_naming_every_batch_fails_the_letter_with_nothing_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No resend writes one (a later batch was refused): it was taken as all sent, and the
    letter marked re-sent with nothing sent."""
    directory = tmp_path / "dead-letter"
    store = DeadLetterStore(directory)
    store.add_batches([refused(7, build_batch([SampleRecord(b"k", b"a", 1)]) * 2)])
    [letter] = list_dead_letters(directory)
    store.mark_taken(letter, 5)
    sent: list[object] = []

    async def send_one(client: object, leader: int, key: object, parts: object, t: float) -> int:
        sent.append(parts)
        return 0

    monkeypatch.setattr(resend.ClusterClient, "for_config", lambda *a, **k: _Cluster())
    monkeypatch.setattr(resend, "_send_one", send_one)
    summary = resend.resend_dead_letters(directory, {"bootstrap.servers": "unused:9092"})
    [(letter_id, why)] = summary.failed
    assert letter_id == "7-0" and why.startswith("its taken mark names 5 of its 2 batches")
    assert (summary.resent, sent) == ([], [])
    assert len(list_dead_letters(directory)) == 1


def test_a_broker_with_no_usable_produce_version_fails_the_letters_with_a_summary() -> None:
    """The ValueError ended the run with a traceback and no summary."""

    async def no_version(client: object, leader: int, key: object, parts: object, t: float) -> int:
        raise ValueError("broker 127.0.0.1:9 speaks no usable version of API 0")

    one = letter(partition=2, payload=build_batch([SampleRecord(None, b"v", 1)]))
    summary = _run([one], no_version)
    assert summary.failed == [("9-0", "broker 127.0.0.1:9 speaks no usable version of API 0")]
