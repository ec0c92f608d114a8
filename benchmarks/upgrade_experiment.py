"""An agent of another checkout killed, then this checkout's agent on the same volume.

    git archive <commit> src | tar -x -C /tmp/old   # and copy the compiled *.so files in
    .venv/bin/python benchmarks/upgrade_experiment.py --old-src /tmp/old/src \\
        [--records 20000] [--variants upgrade,recreated-wal,recreated-wal-old]

One Apache Kafka node (``make tools``). Each variant: the old agent (``PYTHONPATH`` the other
checkout's ``src``, checkpoints every 600 s so that nothing it sends is checkpointed) takes
``--records`` records from an idempotent client on a 3-partition topic, forwards them all and
is killed (SIGKILL). Then:

- ``upgrade``: this checkout's agent starts on the volume and sends again what the old one
  sent (its checkpoint never moved);
- ``recreated-wal``: ``wal/`` is removed (``state/`` kept), this checkout's agent starts and
  takes as many new records again;
- ``recreated-wal-old``: the same with the old agent again (the control).

Prints per variant the records acknowledged, the copies in Kafka, how many acknowledged are
missing and how many are stored twice, and the forwarder's line saying which producer it
forwards as. Not a test: a probe of the upgrade path and of a WAL recreated beside its state.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import sys
import tempfile
import time
from pathlib import Path

from durable_producer.local.agent_process import AgentProcess
from durable_producer.local.broker import running_broker
from durable_producer.local.topics import consume_all, create_topic

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.kafka_clients import produce_values

CLIENT = {"enable.idempotence": True, "acks": "all", "linger.ms": 0}
AGENT_ARGS = ["--checkpoint-interval", "600"]


def _agent(old_src: Path | None, data: Path, bootstrap: str, log: Path) -> AgentProcess:
    class Agent(AgentProcess):
        def environment(self) -> dict[str, str]:
            env = super().environment()
            return env if old_src is None else dict(env, PYTHONPATH=str(old_src))

    return Agent(data, bootstrap, extra_args=AGENT_ARGS, log_path=log).start()


def _acknowledged(bootstrap: str, topic: str, values: list[bytes]) -> None:
    delivered = produce_values(bootstrap, topic, values, CLIENT).delivered
    if len(delivered) != len(values):
        raise SystemExit(f"only {len(delivered)} of {len(values)} acknowledged")


def _variant(name: str, old_src: Path, records: int, bootstrap: str, root: Path) -> None:
    topic = f"upgrade-{name}"
    create_topic(bootstrap, topic, 3)
    data = root / name / "volume"
    old = _agent(old_src, data, bootstrap, root / f"{name}-old.log")
    values = [b"%s-%07d" % (name.encode(), n) for n in range(records)]
    _acknowledged(old.bootstrap, topic, values)
    deadline = time.monotonic() + 60
    while old.metric("durable_agent_forwarded_records_total") < records:
        if time.monotonic() > deadline:
            raise SystemExit("the old agent did not forward every record within 60 s")
        time.sleep(0.1)
    time.sleep(0.5)  # its identity written past the last acknowledgement
    old.kill()
    if name.startswith("recreated-wal"):
        shutil.rmtree(data / "wal")
    new_src = old_src if name.endswith("-old") else None
    log = root / f"{name}-new.log"
    new = _agent(new_src, data, bootstrap, log)
    if name.startswith("recreated-wal"):
        more = [b"new-%s-%07d" % (name.encode(), n) for n in range(records)]
        _acknowledged(new.bootstrap, topic, more)
        values += more
    deadline = time.monotonic() + 90
    got: list[bytes] = []
    while time.monotonic() < deadline and len(set(got)) < len(values):
        time.sleep(1)
        got = [record.value or b"" for record in consume_all(bootstrap, topic)]
    new.stop()
    counts = collections.Counter(got)
    lost = len(set(values) - set(counts))
    twice = sum(count - 1 for count in counts.values())
    print(f"{name}: acknowledged {len(values)}, in Kafka {len(got)}, missing {lost}, twice {twice}")
    for line in log.read_text().splitlines():
        if "forwarding as" in line or "another WAL" in line:
            print("    " + line.split(": ", 1)[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old-src", type=Path, required=True, help="the other checkout's src")
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--variants", default="upgrade,recreated-wal,recreated-wal-old")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="upgrade-") as tmp, running_broker() as broker:
        for name in args.variants.split(","):
            _variant(name, args.old_src.resolve(), args.records, broker.bootstrap, Path(tmp))


if __name__ == "__main__":
    main()
