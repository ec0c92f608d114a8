"""What the forwarder does about each answer Kafka gives a batch: the decisions only.

- ``DONE``: taken (no error; DUPLICATE_SEQUENCE_NUMBER: a copy it already holds).
- ``RESOLVE``: the broker's view of our producer differs from ours (OUT_OF_ORDER_SEQUENCE_NUMBER
  for the first unacknowledged batch, UNKNOWN_PRODUCER_ID, INVALID_PRODUCER_EPOCH,
  PRODUCER_FENCED): ask the leader what it holds (``partition_queue``). An out-of-order answer
  for a later batch only means an earlier one failed: ``RETRY``.
- ``REFRESH``: the leader moved or is unknown (NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE,
  UNKNOWN_TOPIC_OR_PARTITION, KAFKA_STORAGE_ERROR, ...): new metadata, then retry. A partition
  whose topic stays unknown (deleted) for ``unknown_topic_wait_s`` is dead-lettered.
- ``REFUSED``: refused for what the batch is (too large, invalid, authorization, policy; the
  ``PERMANENT`` codes). Retried every backoff for ``dead_letter_after_s`` (ACLs and topic
  configs take a while to reach every broker); a merged batch is first split into the client
  batches it was made of, so only the batch at fault is judged; then dead-lettered whole. A
  batch refused alone for a fault of its own (``OWN_FAULTS``: too large, invalid record)
  within that time of a batch of its partition dead-lettered for the same goes at once: a
  topic's limit lowered under a backlog refuses thousands, and a window each took days.
- ``RETRY``: anything else (timeouts, NOT_ENOUGH_REPLICAS, throttling, unknown codes): retried
  after a backoff, for ever; records never expire.
"""

from __future__ import annotations

from enum import Enum

from kio.schema.errors import ErrorCode

from durable_producer.buffer_agent.kafka.sasl import SaslFailed


class AnswerVerdict(Enum):
    """What Kafka's answer to a forwarded batch calls for (the module docstring)."""

    DONE = "done"
    RESOLVE = "resolve"
    REFRESH = "refresh"
    REFUSED = "refused"
    RETRY = "retry"


def _codes(*codes: ErrorCode | int) -> frozenset[int]:
    return frozenset(map(int, codes))


_E = ErrorCode
TOO_LARGE = _codes(_E.message_too_large, _E.record_list_too_large)
OWN_FAULTS = TOO_LARGE | _codes(_E.invalid_record)
"""``PERMANENT`` refusals of what one batch is (its size, its records), that no wait changes
(the module docstring). Not CORRUPT_MESSAGE (Kafka's clients retry it: damage in transit)
nor INVALID_TIMESTAMP (a timestamp ahead of the broker's clock becomes valid)."""
NOT_AUTHORIZED = _codes(_E.topic_authorization_failed, _E.cluster_authorization_failed)
PERMANENT = (
    OWN_FAULTS
    | NOT_AUTHORIZED
    | _codes(
        _E.corrupt_message,
        _E.invalid_timestamp,
        _E.policy_violation,
        _E.invalid_topic_exception,
        _E.unsupported_for_message_format,
        _E.unsupported_compression_type,
        _E.invalid_required_acks,
        _E.transactional_id_authorization_failed,
    )
)
UNKNOWN_TOPIC = int(_E.unknown_topic_or_partition)
_NO_LEADER_HERE = _codes(
    _E.not_leader_or_follower,
    _E.leader_not_available,
    _E.unknown_topic_or_partition,
    _E.fenced_leader_epoch,
    _E.unknown_leader_epoch,
)
"""The partition's leader is not where the metadata said (refused before the append)."""
_REFRESH = _NO_LEADER_HERE | _codes(
    _E.kafka_storage_error, _E.network_exception, _E.replica_not_available
)
OUT_OF_ORDER = int(_E.out_of_order_sequence_number)
_PRODUCER_STATE = _codes(
    _E.unknown_producer_id,
    _E.invalid_producer_epoch,
    _E.producer_fenced,
    _E.invalid_producer_id_mapping,
)
_DONE = _codes(_E.none, _E.duplicate_sequence_number)
NOT_APPENDED = (
    PERMANENT | _PRODUCER_STATE | _NO_LEADER_HERE | _codes(OUT_OF_ORDER, _E.not_enough_replicas)
)
"""Answers that say the broker did not append the batch (checked before the append)."""
MAYBE_APPENDED = _codes(_E.request_timed_out, _E.not_enough_replicas_after_append)
"""Answers that say the leader appended the batch but could not replicate it in time: a copy
may be in Kafka (or be truncated away with a leader change)."""


def judge(code: int, *, head_of_line: bool) -> AnswerVerdict:
    """``head_of_line``: the batch is its partition's first unacknowledged one."""
    if code in _DONE:
        return AnswerVerdict.DONE
    if code in _PRODUCER_STATE or (code == OUT_OF_ORDER and head_of_line):
        return AnswerVerdict.RESOLVE
    if code in _REFRESH:
        return AnswerVerdict.REFRESH
    if code in PERMANENT:
        return AnswerVerdict.REFUSED
    return AnswerVerdict.RETRY


NETWORK = int(_E.network_exception)
_TIMEOUT = int(_E.request_timed_out)


def transport_code(error: BaseException) -> int:
    """The Kafka error code a failed connection or request stands for (a refused SASL login
    is no network fault: the credentials or the mechanism are wrong)."""
    if isinstance(error, SaslFailed):
        return error.code
    return _TIMEOUT if isinstance(error, TimeoutError) else NETWORK


def acl_hint(code: int) -> str:
    """What to grant, for an answer refusing the agent's principal (else "")."""
    if code not in NOT_AUTHORIZED:
        return ""
    return (
        ": the agent's principal needs WRITE on the topics (before Kafka 3.0: IDEMPOTENT_WRITE"
        " on the cluster; docs/agent.md, Kafka security and ACLs)"
    )


def error_name(code: int) -> str:
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"ERROR_{code}"
