"""Spark task retries (``local[2,3]``): the agent is killed mid-write and restarted, as its
sidecar would be; the job still succeeds, every row is in Kafka, and the duplicates lie between
the sink's two counts: rows the failed attempts had acknowledged (at least that many) and rows
the retried attempts re-sent plus those the agent counted possible after its restart (at most)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from durable_producer.local.agent_process import AgentProcess
from integration.spark_integration.spark_harness import KafkaEndpoint
from support.broker import consume_all
from support.waiting import wait_for

pytestmark = pytest.mark.integration

JOB = Path(__file__).with_name("retry_job.py")
ROWS = 200_000
KILL_AFTER_ROWS = 30_000
AGENT_DOWN_S = 6.0  # longer than the job's kafka.message.timeout.ms (3 s): attempts fail

FAILED_ATTEMPT = re.compile(
    r"durable-kafka: partition (\d+), attempt (\d+) failed after (\d+) of (\d+) rows"
)
RETRIED_ATTEMPT = re.compile(
    r"durable-kafka: partition (\d+), attempt (\d+): retried attempt re-sent (\d+) rows"
)
COMMITTED = re.compile(r"durable-kafka: write: (\d+) of (\d+) records were written by retried")


def test_killed_agent_fails_attempts_that_spark_retries_and_every_row_arrives(
    kafka_endpoint: KafkaEndpoint, tmp_path: Path
) -> None:
    topic = kafka_endpoint.new_topic(partitions=2)
    stderr_path = tmp_path / "job.stderr"
    with AgentProcess(tmp_path / "volume", kafka_endpoint.kafka.bootstrap) as agent:
        with stderr_path.open("wb") as stderr:
            job = subprocess.Popen(
                [sys.executable, str(JOB), agent.bootstrap, topic, str(ROWS)],
                stdout=subprocess.PIPE,
                stderr=stderr,
                env={**os.environ, "PYSPARK_PYTHON": sys.executable},
            )
            try:

                def written() -> bool:
                    if job.poll() is not None:
                        raise AssertionError(f"the job ended early: {stderr_path.read_text()}")
                    return agent.metric("durable_agent_ingest_records_total") >= KILL_AFTER_ROWS

                wait_for(
                    written,
                    timeout=180,
                    interval=0.05,
                    what=f"{KILL_AFTER_ROWS} rows in the agent",
                )
                agent.kill()
                time.sleep(AGENT_DOWN_S)
                agent.start()  # the sidecar's restart: same port, same volume
                output, _ = job.communicate(timeout=300)
            finally:
                if job.poll() is None:
                    job.kill()
                    job.wait()
        log = stderr_path.read_text(errors="replace")
        assert job.returncode == 0, f"the job failed:\n{log[-4000:]}"
        wait_for(
            lambda: agent.metric("durable_agent_backlog_records") == 0,
            timeout=120,
            what="the agent to forward its backlog",
        )
        possible = agent.metric("durable_agent_possible_duplicates_total")
    result = json.loads(output.decode().strip().splitlines()[-1])
    assert result["rows"] == ROWS

    records = consume_all(kafka_endpoint.read_bootstrap, topic, timeout=180, idle=3.0)
    copies = Counter(int(record.value or b"-1") for record in records)
    assert set(copies) == set(range(ROWS)), "every row is in Kafka"
    duplicates = sum(count - 1 for count in copies.values())

    failed = [tuple(map(int, match)) for match in FAILED_ATTEMPT.findall(log)]
    retried = [tuple(map(int, match)) for match in RETRIED_ATTEMPT.findall(log)]
    committed = [tuple(map(int, match)) for match in COMMITTED.findall(log)]
    assert failed, f"no task attempt failed while the agent was down:\n{log[-4000:]}"
    assert retried, "the failed tasks were retried"
    acknowledged_by_failed = sum(acknowledged for _, _, acknowledged, _ in failed)
    resent = sum(rows for _, _, rows in retried)
    assert committed == [(resent, ROWS)]
    print(
        f"{len(failed)} failed attempts had {acknowledged_by_failed} rows acknowledged; "
        f"{len(retried)} retries re-sent {resent} rows; {duplicates} duplicates in Kafka; "
        f"agent counted {possible:.0f} possible; job {result['seconds']} s"
    )
    # Rows a failed attempt had acknowledged are in the WAL, so in Kafka twice once retried;
    # rows it sent without getting an answer may be too; a retried attempt re-sends all rows.
    assert acknowledged_by_failed <= duplicates <= resent + possible, "duplicates counted"
    assert len(records) == ROWS + duplicates
