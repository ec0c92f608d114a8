"""check_bounds: every request a client can send, and every answer the agent reads from a
broker, is walked to its end as kio reads it, and one declaring more elements or bytes than it
holds is refused before kio reserves them.

A Metadata v12 request of 17 bytes declaring 2**32 - 2 topics made kio's reader ask for
34 GB and abort the agent's process (tests/integration/buffer_agent/ingest/
test_declared_counts.py runs it against a real agent process); so did a Produce answer of 6
bytes, in the forwarder (a real broker never sends one: here the answers are bytes given to
the agent's answer reader, in a child process where the abort would show).
"""

from __future__ import annotations

import io
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest
from kio.serial import entity_writer

from durable_producer.buffer_agent.kafka.cluster_client import HIGHEST_ASKED
from durable_producer.buffer_agent.kafka.connection import API_VERSIONS_VERSION
from durable_producer.buffer_agent.kafka.produce_wire import HIGHEST_PRODUCE_VERSION
from durable_producer.buffer_agent.kafka.protocol import (
    API_API_VERSIONS,
    API_METADATA,
    API_PRODUCE,
    SUPPORTED_API_VERSIONS,
    MalformedFrame,
    decode_body,
    parse_request,
    request_schema,
    response_schema,
)
from durable_producer.buffer_agent.kafka.sasl import (
    API_SASL_AUTHENTICATE,
    API_SASL_HANDSHAKE,
    HANDSHAKE_VERSION,
    HIGHEST_AUTHENTICATE_VERSION,
)
from durable_producer.buffer_agent.kafka.varint import encode_uvarint
from durable_producer.buffer_agent.kafka.wire_bounds import (
    Edits,
    OutOfBounds,
    check_bounds,
    edited,
)
from support.kafka_wire import (
    CURRENT_LEADER,
    UNKNOWN_TAG,
    encode_request_body,
    full_sample,
    produce_answer,
)

VERSIONS = [
    (api, version)
    for api, (lowest, highest) in SUPPORTED_API_VERSIONS.items()
    if api != API_PRODUCE  # parsed by parse_produce, not kio
    for version in range(lowest, highest + 1)
]

@pytest.mark.parametrize(("api", "version"), VERSIONS)
def test_a_full_request_is_walked_to_its_end_and_decoded_as_before(api: int, version: int) -> None:
    schema = request_schema(api, version)
    body = full_sample(schema)
    frame = encode_request_body(api, version, 5, body)

    header_end = check_bounds(schema.__header_schema__, frame, 0, header=True)
    assert check_bounds(schema, frame, header_end) == len(frame)
    assert parse_request(frame).body == body


def frame_of(api: int, version: int, body: bytes) -> bytes:
    header = struct.pack(">hhih", api, version, 1, 1) + b"c"
    if request_schema(api, version).__header_schema__.__flexible__:
        header += b"\x00"  # no tagged fields
    return header + body


@pytest.mark.parametrize(
    ("api", "version", "body"),
    [
        (3, 12, b"\xff\xff\xff\xff\x0f"),  # 2**32 - 2 topics, compact
        (3, 1, struct.pack(">i", 2**31 - 1)),  # legacy
        (1, 4, struct.pack(">iiiib", -1, 0, 0, 0, 0) + struct.pack(">i", 2**31 - 1)),
        (3, 9, b"\x01\xff\xff\xff\xff\x0f"),  # no topics, then 2**32 - 1 tagged fields
        (22, 4, b"\xff\xff\xff\xff\x0f"),  # a transactional id of 2**32 - 2 bytes
    ],
    ids=["metadata-v12", "metadata-v1", "fetch-v4", "tagged-fields", "string"],
)
def test_a_count_or_length_beyond_the_frame_is_a_malformed_frame(
    api: int, version: int, body: bytes
) -> None:
    with pytest.raises(MalformedFrame, match=r"OutOfBounds: .*(elements declared|bytes at byte)"):
        parse_request(frame_of(api, version, body))


def test_a_request_other_than_produce_above_its_limit_is_a_malformed_frame() -> None:
    """A Metadata request of 4 MB naming 2,000,000 empty topics held the ingest's loop for
    3.7 s (walk and kio); a frame may be 100 MiB."""
    topics = 2_000_000
    frame = frame_of(3, 1, struct.pack(">i", topics) + b"\x00\x00" * topics)
    with pytest.raises(MalformedFrame, match=r"a request of 4000015 bytes; at most 1048576"):
        parse_request(frame)
    fits = 1000
    request = parse_request(frame_of(3, 1, struct.pack(">i", fits) + b"\x00\x00" * fits))
    assert len(request.body.topics) == fits


# The answers the agent's Kafka client reads, up to the highest it asks for. Produce answers are
# read by hand (produce_wire.read_answer, test_produce_wire.py); walked here, their tagged fields
# are the walk's only known ones.
ANSWERS_READ = {
    **HIGHEST_ASKED,
    API_PRODUCE: HIGHEST_PRODUCE_VERSION,
    API_API_VERSIONS: API_VERSIONS_VERSION,
    API_SASL_HANDSHAKE: HANDSHAKE_VERSION,
    API_SASL_AUTHENTICATE: HIGHEST_AUTHENTICATE_VERSION,
}


def answer_versions() -> list[tuple[int, int]]:
    found = []
    for api, highest in ANSWERS_READ.items():
        for version in range(highest + 1):
            try:
                response_schema(api, version)
            except Exception:  # kio has no such version (DescribeConfigs v0): never asked for
                continue
            found.append((api, version))
    return found


@pytest.mark.parametrize(("api", "version"), answer_versions())
def test_a_full_answer_is_walked_to_its_end_and_decoded_as_before(api: int, version: int) -> None:
    """Tagged fields included (Produce v10+: each partition's current leader, the brokers'
    endpoints): full_sample sets them all."""
    schema = response_schema(api, version)
    answer = full_sample(schema)
    buffer = io.BytesIO()
    entity_writer(schema)(buffer, answer)
    data = buffer.getvalue()

    assert check_bounds(schema, data, 0) == len(data)
    assert decode_body(api, version, data) == answer


HOSTILE_ANSWERS = {
    "produce-v9": (0, 9, b"\xff\xff\xff\xff\x0f\x00"),  # 2**32 - 2 topics, compact
    "produce-v3": (0, 3, struct.pack(">i", 2**31 - 1)),  # legacy
    # No topics, no throttle; then one tagged field, the brokers' endpoints (tag 0), of 5
    # bytes declaring 2**32 - 2 of them.
    "produce-v11-tagged": (0, 11, b"\x01" + bytes(4) + b"\x01\x00\x05\xff\xff\xff\xff\x0f"),
    # The endpoints (tag 0) declared 8 bytes long, holding none in 1 byte: kio read on from
    # there and took the rest for a second tagged field, the endpoints again, declaring
    # 2**32 - 2 of them (the walk had gone on from the declared end, to a field it skipped).
    "produce-v11-hidden-tag": (
        0,
        11,
        b"\x01" + bytes(4) + b"\x02\x00\x08" + b"\x01\x00\x05\xff\xff\xff\xff\x0f" + b"\x07\x00",
    ),
    "metadata-v12": (3, 12, bytes(4) + b"\xff\xff\xff\xff\x0f"),  # 2**32 - 2 brokers
    "api-versions-v0": (18, 0, bytes(2) + struct.pack(">i", 2**31 - 1)),
}


@pytest.mark.parametrize("name", HOSTILE_ANSWERS)
def test_an_answer_declaring_more_than_it_holds_is_refused(name: str) -> None:
    api, version, data = HOSTILE_ANSWERS[name]
    why = r"elements declared at byte \d+ of \d+|tagged field 0 at byte 6: not 8 bytes long"
    with pytest.raises(OutOfBounds, match=why):
        check_bounds(response_schema(api, version), data, 0)


def test_an_answer_declaring_more_than_it_holds_does_not_abort_the_process() -> None:
    """Each hostile answer through the reader the forwarder uses (``decode_answer``), in a
    child process: kio's failed allocation of 34 GB aborted it (exit 134) before the walk.
    The child is held to 3 GB of address space, so a 17 GB legacy count fails there too."""
    script = textwrap.dedent(
        f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
        from durable_producer.buffer_agent.kafka.connection import decode_answer

        class Connection:
            address = "broker:9092"
            closed = False
            def close(self):
                self.closed = True

        for name, (api, version, data) in {HOSTILE_ANSWERS!r}.items():
            connection = Connection()
            try:
                decode_answer(connection, api, version, data)
                print(name, "decoded")
            except Exception as error:
                print(name, type(error).__name__, connection.closed)
        """
    )
    child = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.split("\n")[:-1] == [
        f"{name} UndecodableAnswer True" for name in HOSTILE_ANSWERS
    ]


def test_a_length_of_zero_in_two_bytes_is_walked_as_kio_reads_it() -> None:
    """A varint may spell 0 in more bytes than one (0x80 0x00): a null error message, then
    the rest of a SaslAuthenticate v2 answer, as kio reads it."""
    data = b"\x00\x00" + b"\x80\x00" + b"\x03ab" + bytes(8) + b"\x00"
    assert check_bounds(response_schema(API_SASL_AUTHENTICATE, 2), data, 0) == len(data)
    answer = decode_body(API_SASL_AUTHENTICATE, 2, data)
    assert (answer.error_message, answer.auth_bytes) == (None, b"ab")



@pytest.mark.parametrize(
    ("version", "known"), [(9, b""), (11, CURRENT_LEADER)], ids=["v9", "v11-beside-a-known-one"]
)
def test_an_answer_with_tagged_fields_its_version_does_not_know_reads_as_without_them(
    version: int, known: bytes
) -> None:
    """A broker adds a tagged field to an answer without a new version, and Kafka's readers
    skip one they do not know. kio refused it (KeyError): every answer of such a broker was
    lost, and the forwarder sent the same batches again for good."""
    plain = produce_answer(bytes([1 if known else 0]) + known, b"\x00", b"\x00")
    extra = produce_answer(
        bytes([2 if known else 1]) + known + UNKNOWN_TAG,
        b"\x01" + UNKNOWN_TAG,
        b"\x02" + UNKNOWN_TAG + b"\x64\x00",  # and tag 100, empty
    )
    edits: Edits = []
    assert check_bounds(response_schema(API_PRODUCE, version), extra, 0, edits=edits) == len(extra)
    counts = (bytes([1 if known else 0]), b"\x00", b"\x00")  # the count of each level's
    spans = [(1, counts[0]), (5, b""), (1, counts[1]), (5, b""), (1, counts[2]), (7, b"")]
    assert [(end - start, new) for start, end, new in edits] == spans  # two in a row: one
    assert edited(extra, edits) == plain
    answer = decode_body(API_PRODUCE, version, extra)
    assert answer == decode_body(API_PRODUCE, version, plain)
    assert answer.responses[0].partition_responses[0].base_offset == 5


def test_a_known_tagged_field_holding_an_unknown_one_is_dropped_whole() -> None:
    """Dropping the inner one would change the known one's size. The agent reads no tagged
    field of an answer (the partition's current leader here): kio gives its default."""
    leader = struct.pack(">ii", 2, 7) + b"\x01" + UNKNOWN_TAG
    data = produce_answer(b"\x01\x00" + bytes([len(leader)]) + leader, b"\x00", b"\x00")
    answer = decode_body(API_PRODUCE, 11, data)
    assert answer == decode_body(API_PRODUCE, 11, produce_answer(b"\x00", b"\x00", b"\x00"))
    assert answer.responses[0].partition_responses[0].current_leader.leader_id == -1


def test_many_unknown_tagged_fields_in_a_row_are_one_span() -> None:
    """500,000 empty unknown tags in 1 MB of answer made a tuple and a view each (193 MB for a
    request of 1 MiB, 367 MB for this answer): a run of them is one span."""
    tags = 500_000
    data = b"\x01" + bytes(4) + encode_uvarint(tags) + b"\x01\x00" * tags
    edits: Edits = []
    assert check_bounds(response_schema(API_PRODUCE, 9), data, 0, edits=edits) == len(data)
    assert edits == [(5, 8, b"\x00"), (8, len(data), b"")]
    assert decode_body(API_PRODUCE, 9, data).responses == ()


def init_producer_id_answer(code: int) -> bytes:
    return struct.pack(">ihqh", 0, code, 5, 0) + b"\x00"  # v4: producer 5, epoch 0


def legacy_produce_answer(code: int) -> bytes:
    partition = struct.pack(">ihqq", 0, code, 5, -1)
    return struct.pack(">ih", 1, 1) + b"t" + struct.pack(">i", 1) + partition + bytes(4)  # v3


def flexible_produce_answer(code: int) -> bytes:  # v11, a known tagged field beside it
    partition = struct.pack(">ihqqq", 0, code, 5, -1, 0) + b"\x01\x00\x01" + CURRENT_LEADER
    return b"\x02\x02t\x02" + partition + b"\x00" + bytes(4) + b"\x00"


@pytest.mark.parametrize(
    ("api", "version", "answer_of"),
    [
        (22, 4, init_producer_id_answer),
        (0, 3, legacy_produce_answer),
        (0, 11, flexible_produce_answer),
    ],
    ids=["init-producer-id-v4", "produce-v3", "produce-v11"],
)
def test_an_error_code_the_reader_does_not_know_is_an_unknown_server_error(
    api: int, version: int, answer_of: Callable[[int], bytes]
) -> None:
    """A newer broker's error code: Kafka's clients read it as UNKNOWN_SERVER_ERROR (-1);
    kio refused the whole answer (ValueError), and the forwarder sent the batch again and
    again."""
    assert decode_body(api, version, answer_of(1234)) == decode_body(api, version, answer_of(-1))
    assert decode_body(api, version, answer_of(3)) != decode_body(api, version, answer_of(-1))


def test_a_request_with_tagged_fields_its_version_does_not_know_reads_as_without_them() -> None:
    """In the header and in the body (a Metadata v12 request naming no topic); a broker
    answers it, so does the agent (before, it closed the connection)."""
    header = struct.pack(">hhih", API_METADATA, 12, 1, 1) + b"c"
    plain = parse_request(header + b"\x00" + b"\x01\x00\x00\x00")
    request = parse_request(header + b"\x01" + UNKNOWN_TAG + b"\x01\x00\x00\x01" + UNKNOWN_TAG)
    assert request == plain
