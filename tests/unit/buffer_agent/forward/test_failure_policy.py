"""Which refusals are final, and which of them judge the batch itself."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from durable_producer.buffer_agent.forward.failure_policy import (
    NOT_AUTHORIZED,
    OWN_FAULTS,
    PERMANENT,
    TOO_LARGE,
    AnswerVerdict,
    judge,
)


def test_a_batch_s_own_faults_are_final_refusals_that_no_wait_changes() -> None:
    assert TOO_LARGE | {int(ErrorCode.invalid_record)} == OWN_FAULTS
    assert OWN_FAULTS < PERMANENT and NOT_AUTHORIZED < PERMANENT
    assert not OWN_FAULTS & NOT_AUTHORIZED
    for code in (ErrorCode.corrupt_message, ErrorCode.invalid_timestamp):
        assert int(code) in PERMANENT and int(code) not in OWN_FAULTS  # may pass with time


def test_every_final_refusal_is_judged_refused() -> None:
    for code in PERMANENT:
        assert judge(code, head_of_line=True) is AnswerVerdict.REFUSED
        assert judge(code, head_of_line=False) is AnswerVerdict.REFUSED
