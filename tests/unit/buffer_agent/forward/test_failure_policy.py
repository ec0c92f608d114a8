"""Each Kafka error gets the verdict the no-loss promise needs, decided without a broker."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from durable_producer.buffer_agent.forward.failure_policy import (
    PERMANENT_ERRORS,
    UNKNOWN_TOPIC_ERRORS,
    RecordFailurePolicy,
    Verdict,
    batch_failure,
    fatal_error,
)

WAIT = 60.0


def _judge(
    policy: RecordFailurePolicy,
    code: int,
    now: float = 0.0,
    *,
    partition: int = 0,
    synchronous: bool = False,
    isolating: bool = False,
) -> Verdict:
    return policy.judge(
        code, "orders", partition, now, synchronous=synchronous, isolating=isolating
    )


def test_the_error_classes_do_not_overlap() -> None:
    assert not PERMANENT_ERRORS & UNKNOWN_TOPIC_ERRORS
    assert KafkaError.MSG_SIZE_TOO_LARGE in PERMANENT_ERRORS
    assert KafkaError.UNKNOWN_TOPIC_OR_PART in UNKNOWN_TOPIC_ERRORS


@pytest.mark.parametrize("code", sorted(PERMANENT_ERRORS))
def test_a_record_refused_on_its_own_for_good_is_dead_lettered(code: int) -> None:
    policy = RecordFailurePolicy(WAIT)

    assert _judge(policy, code, synchronous=True) is Verdict.DEAD_LETTER
    assert _judge(policy, code, isolating=True) is Verdict.DEAD_LETTER


def test_a_batch_refused_for_good_is_sent_again_one_record_per_request() -> None:
    """The broker's refusal may concern only one record of the batch: nothing is
    dead-lettered before the records are judged one by one."""
    policy = RecordFailurePolicy(WAIT)

    assert _judge(policy, KafkaError.MSG_SIZE_TOO_LARGE) is Verdict.ISOLATE


@pytest.mark.parametrize(
    "code",
    [
        KafkaError._PURGE_QUEUE,
        KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError._MSG_TIMED_OUT,
    ],
)
def test_any_other_record_error_resets_the_producer(code: int) -> None:
    policy = RecordFailurePolicy(WAIT)

    assert _judge(policy, code) is Verdict.RESET
    assert _judge(policy, code, synchronous=True, isolating=True) is Verdict.RESET


@pytest.mark.parametrize("code", sorted(UNKNOWN_TOPIC_ERRORS))
def test_an_unknown_partition_is_retried_until_the_wait_is_over(code: int) -> None:
    policy = RecordFailurePolicy(WAIT)

    assert _judge(policy, code, now=100.0) is Verdict.RETRY
    assert _judge(policy, code, now=130.0) is Verdict.RETRY
    assert _judge(policy, code, now=159.9) is Verdict.RETRY
    assert _judge(policy, code, now=160.0) is Verdict.DEAD_LETTER
    assert _judge(policy, code, now=170.0) is Verdict.DEAD_LETTER, "still the same spell"


def test_unknown_partitions_are_timed_separately() -> None:
    policy = RecordFailurePolicy(WAIT)
    code = KafkaError._UNKNOWN_PARTITION

    assert _judge(policy, code, now=0.0, partition=7) is Verdict.RETRY
    assert _judge(policy, code, now=50.0, partition=8) is Verdict.RETRY
    assert _judge(policy, code, now=60.0, partition=7) is Verdict.DEAD_LETTER
    assert _judge(policy, code, now=60.0, partition=8) is Verdict.RETRY


def test_a_quiet_period_longer_than_the_wait_starts_a_new_spell() -> None:
    policy = RecordFailurePolicy(WAIT)
    code = KafkaError._UNKNOWN_TOPIC

    assert _judge(policy, code, now=0.0) is Verdict.RETRY
    assert _judge(policy, code, now=59.0) is Verdict.RETRY
    # Nothing failed for just over the wait: the topic came back meanwhile.
    assert _judge(policy, code, now=119.5) is Verdict.RETRY
    assert _judge(policy, code, now=179.0) is Verdict.RETRY
    assert _judge(policy, code, now=179.5) is Verdict.DEAD_LETTER


def test_a_quiet_period_as_long_as_the_wait_continues_the_spell() -> None:
    policy = RecordFailurePolicy(WAIT)
    code = KafkaError._UNKNOWN_TOPIC

    assert _judge(policy, code, now=0.0) is Verdict.RETRY
    assert _judge(policy, code, now=WAIT) is Verdict.DEAD_LETTER


def test_a_failed_sparse_report_resends_carefully_isolating_permanent_refusals() -> None:
    assert batch_failure(KafkaError.MSG_SIZE_TOO_LARGE) is Verdict.ISOLATE
    assert batch_failure(KafkaError.TOPIC_AUTHORIZATION_FAILED) is Verdict.ISOLATE
    assert batch_failure(KafkaError._PURGE_QUEUE) is Verdict.RESET
    assert batch_failure(KafkaError.UNKNOWN_TOPIC_OR_PART) is Verdict.RESET


def test_a_gapless_guarantee_failure_isolates_any_other_fatal_error_resets() -> None:
    assert fatal_error(KafkaError._GAPLESS_GUARANTEE) is Verdict.ISOLATE
    assert fatal_error(KafkaError._FENCED) is Verdict.RESET
    assert fatal_error(KafkaError.INVALID_PRODUCER_EPOCH) is Verdict.RESET


# --------------------------------------------------------------------- the retry window
REFUSED_WAIT = 120.0


@pytest.mark.parametrize(
    "code", [KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.MSG_SIZE_TOO_LARGE]
)
def test_a_refused_record_is_retried_for_the_window_then_dead_lettered(code: int) -> None:
    """ACLs propagating, a topic's size limit raised back: the refusal may clear."""
    policy = RecordFailurePolicy(WAIT, REFUSED_WAIT)

    assert _judge(policy, code, now=0.0, isolating=True) is Verdict.RETRY
    assert _judge(policy, code, now=119.0, isolating=True) is Verdict.RETRY
    assert _judge(policy, code, now=120.0, isolating=True) is Verdict.DEAD_LETTER
    assert _judge(policy, code, now=125.0, isolating=True) is Verdict.DEAD_LETTER, "same spell"
    # A batch refused in sparse mode is still judged one record at a time first.
    assert _judge(policy, code, now=125.0) is Verdict.ISOLATE


def test_the_clients_own_refusals_are_dead_lettered_at_once() -> None:
    """produce() refusing a record larger than the client's message.max.bytes: no change on
    the cluster can help."""
    policy = RecordFailurePolicy(WAIT, REFUSED_WAIT)

    assert _judge(policy, KafkaError.MSG_SIZE_TOO_LARGE, synchronous=True) is Verdict.DEAD_LETTER
    assert _judge(policy, KafkaError._INVALID_ARG, synchronous=True) is Verdict.DEAD_LETTER
    # The topic's cached authorization error, raised by produce(), is the cluster's answer.
    refusal = KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert _judge(policy, refusal, synchronous=True) is Verdict.RETRY


def test_a_window_of_0_dead_letters_at_once() -> None:
    policy = RecordFailurePolicy(WAIT, 0.0)

    refusal = KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert _judge(policy, refusal, isolating=True) is Verdict.DEAD_LETTER


def test_retries_spaced_wider_than_a_short_wait_do_not_restart_the_spell() -> None:
    policy = RecordFailurePolicy(1.5, 1.5, longest_retry_gap_s=10.0)
    code = KafkaError._UNKNOWN_PARTITION

    assert _judge(policy, code, now=0.0) is Verdict.RETRY
    assert _judge(policy, code, now=1.2) is Verdict.RETRY
    assert _judge(policy, code, now=3.0) is Verdict.DEAD_LETTER, "1.8 s apart: same spell"
