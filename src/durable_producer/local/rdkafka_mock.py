"""librdkafka's mock cluster through ctypes, in this process: the typed binding only.

The confluent-kafka wheel ships librdkafka (``confluent_kafka.libs/librdkafka-*.so.1``) with
the ``rd_kafka_mock_*`` API exported. ``RdKafkaMockCluster`` owns one ``rd_kafka_t`` handle
(made with ``rd_kafka_new``: the mock cluster needs one for its logging and timers) and one
mock cluster of N brokers listening on real loopback TCP ports; ``close`` destroys both.

Use ``mock_cluster.MockCluster`` instead: it runs this in a child process. This module is
what that child runs, and what its unit tests check.

Rules the binding keeps (each learnt from a segfault): every function gets explicit
``argtypes`` and ``restype``, pointers as ``c_void_p`` (a Python int would otherwise be
passed as a 32-bit C int); no variadic function is called (the ``_array`` variants instead).
The mock keeps about 5 MB (and at most 100,000 record batches) per partition and then
silently advances the log start offset: keep test data below that, or read the low
watermark before calling records lost.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from pathlib import Path

# Kafka API keys the faults are injected on.
API_PRODUCE = 0
API_METADATA = 3
API_INIT_PRODUCER_ID = 22

PARTITION_LOG_MAX_BYTES = 5 * 1024 * 1024
"""What the mock keeps per partition (``mpart->max_size``) before dropping its oldest batches."""
PARTITION_LOG_MAX_BATCHES = 100_000
"""... and at most this many record batches (``mpart->max_cnt``)."""

_RD_KAFKA_PRODUCER = 0
_CONF_OK = 0
_ERRSTR_SIZE = 512

_VOID = ctypes.c_void_p
_SIGNATURES: dict[str, tuple[list[type], type | None]] = {
    "rd_kafka_conf_new": ([], _VOID),
    "rd_kafka_conf_set": (
        [_VOID, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t],
        ctypes.c_int,
    ),
    "rd_kafka_conf_destroy": ([_VOID], None),
    "rd_kafka_new": ([ctypes.c_int, _VOID, ctypes.c_char_p, ctypes.c_size_t], _VOID),
    "rd_kafka_destroy": ([_VOID], None),
    "rd_kafka_err2name": ([ctypes.c_int], ctypes.c_char_p),
    "rd_kafka_version_str": ([], ctypes.c_char_p),
    "rd_kafka_mock_cluster_new": ([_VOID, ctypes.c_int], _VOID),
    "rd_kafka_mock_cluster_destroy": ([_VOID], None),
    "rd_kafka_mock_cluster_bootstraps": ([_VOID], ctypes.c_char_p),
    "rd_kafka_mock_topic_create": (
        [_VOID, ctypes.c_char_p, ctypes.c_int, ctypes.c_int],
        ctypes.c_int,
    ),
    "rd_kafka_mock_topic_set_error": ([_VOID, ctypes.c_char_p, ctypes.c_int], None),
    "rd_kafka_mock_partition_set_leader": (
        [_VOID, ctypes.c_char_p, ctypes.c_int32, ctypes.c_int32],
        ctypes.c_int,
    ),
    "rd_kafka_mock_broker_set_down": ([_VOID, ctypes.c_int32], ctypes.c_int),
    "rd_kafka_mock_broker_set_up": ([_VOID, ctypes.c_int32], ctypes.c_int),
    "rd_kafka_mock_broker_set_rtt": ([_VOID, ctypes.c_int32, ctypes.c_int], ctypes.c_int),
    "rd_kafka_mock_push_request_errors_array": (
        [_VOID, ctypes.c_int16, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int)],
        None,
    ),
    "rd_kafka_mock_clear_request_errors": ([_VOID, ctypes.c_int16], None),
}


class MockClusterError(RuntimeError):
    """A mock-cluster call failed; the message names the call and librdkafka's error."""


def librdkafka_path() -> Path:
    """The librdkafka shared library inside the installed confluent-kafka wheel."""
    import confluent_kafka

    libs = Path(confluent_kafka.__file__).resolve().parent.parent / "confluent_kafka.libs"
    found = sorted(libs.glob("librdkafka*.so*"))
    if not found:
        raise FileNotFoundError(
            f"no librdkafka in {libs}; install the confluent-kafka wheel (not a source build)"
        )
    return found[0]


def load_librdkafka(path: Path | None = None) -> ctypes.CDLL:
    """The library with every function this module calls typed (``_SIGNATURES``)."""
    library = ctypes.CDLL(str(path or librdkafka_path()))
    for name, (argtypes, restype) in _SIGNATURES.items():
        function = getattr(library, name)
        function.argtypes = argtypes
        function.restype = restype
    return library


class RdKafkaMockCluster:
    """One mock cluster of ``brokers`` brokers (ids 1..N), in this process. Thread-safe: every
    call goes to the mock cluster's own thread; ``close`` is idempotent."""

    def __init__(
        self, brokers: int = 3, *, debug: str = "", library: ctypes.CDLL | None = None
    ) -> None:
        """``debug``: librdkafka debug contexts for the mock's log (e.g. ``"mock"``: every
        log append and refused batch, with producer ids and sequence numbers; on stderr)."""
        if brokers < 1:
            raise ValueError(f"a mock cluster needs at least one broker, not {brokers}")
        self.broker_count = brokers
        self._lib = library or load_librdkafka()
        self._lock = threading.Lock()
        self._rk = self._new_handle(debug)
        cluster = self._lib.rd_kafka_mock_cluster_new(self._rk, brokers)
        if not cluster:
            self._lib.rd_kafka_destroy(self._rk)
            raise MockClusterError("rd_kafka_mock_cluster_new returned NULL")
        self._cluster: int | None = cluster

    def _new_handle(self, debug: str) -> int:
        lib = self._lib
        conf = lib.rd_kafka_conf_new()
        errstr = ctypes.create_string_buffer(_ERRSTR_SIZE)
        # The handle only hosts the mock cluster: it must not log a complaint every second.
        settings = [("log_level", "7" if debug else "3"), ("client.id", "mock-cluster-host")]
        if debug:
            settings.append(("debug", debug))
        for name, value in settings:
            if lib.rd_kafka_conf_set(conf, name.encode(), value.encode(), errstr, _ERRSTR_SIZE):
                lib.rd_kafka_conf_destroy(conf)
                raise MockClusterError(f"rd_kafka_conf_set {name}: {errstr.value.decode()}")
        rk = lib.rd_kafka_new(_RD_KAFKA_PRODUCER, conf, errstr, _ERRSTR_SIZE)
        if not rk:  # on failure the conf is still ours
            lib.rd_kafka_conf_destroy(conf)
            raise MockClusterError(f"rd_kafka_new: {errstr.value.decode()}")
        return int(rk)

    @property
    def librdkafka_version(self) -> str:
        return bytes(self._lib.rd_kafka_version_str()).decode()

    def _handle(self) -> int:
        if self._cluster is None:
            raise MockClusterError("the mock cluster is closed")
        return self._cluster

    def _check(self, call: str, error: int) -> None:
        if error:
            name = bytes(self._lib.rd_kafka_err2name(error)).decode()
            raise MockClusterError(f"{call} failed: {name} ({error})")

    def _broker(self, broker_id: int) -> int:
        if not 1 <= broker_id <= self.broker_count:
            raise MockClusterError(f"no broker {broker_id}: the brokers are 1..{self.broker_count}")
        return broker_id

    # ----------------------------------------------------------------- the API
    def bootstraps(self) -> str:
        """``host:port,...`` of every broker."""
        return bytes(self._lib.rd_kafka_mock_cluster_bootstraps(self._handle())).decode()

    def topic_create(self, topic: str, partitions: int, replication_factor: int = 3) -> None:
        replication = min(replication_factor, self.broker_count)
        error = self._lib.rd_kafka_mock_topic_create(
            self._handle(), topic.encode(), partitions, replication
        )
        self._check(f"topic_create {topic}", error)

    def topic_set_error(self, topic: str, error: int) -> None:
        """Metadata answers ``error`` for ``topic`` (0 clears it)."""
        self._lib.rd_kafka_mock_topic_set_error(self._handle(), topic.encode(), error)

    def partition_set_leader(self, topic: str, partition: int, broker_id: int) -> None:
        error = self._lib.rd_kafka_mock_partition_set_leader(
            self._handle(), topic.encode(), partition, self._broker(broker_id)
        )
        self._check(f"partition_set_leader {topic}/{partition} -> {broker_id}", error)

    def broker_set_down(self, broker_id: int) -> None:
        """Close the broker's connections and refuse new ones. Leaders do not move."""
        error = self._lib.rd_kafka_mock_broker_set_down(self._handle(), self._broker(broker_id))
        self._check(f"broker_set_down {broker_id}", error)

    def broker_set_up(self, broker_id: int) -> None:
        error = self._lib.rd_kafka_mock_broker_set_up(self._handle(), self._broker(broker_id))
        self._check(f"broker_set_up {broker_id}", error)

    def broker_set_rtt(self, broker_id: int, rtt_ms: int) -> None:
        """Delay every response of the broker by ``rtt_ms`` (0: no delay)."""
        error = self._lib.rd_kafka_mock_broker_set_rtt(
            self._handle(), self._broker(broker_id), rtt_ms
        )
        self._check(f"broker_set_rtt {broker_id}", error)

    def push_request_errors(self, api_key: int, errors: Sequence[int]) -> None:
        """The next ``len(errors)`` requests of ``api_key`` to any broker get these errors,
        in order, instead of being served (a Produce so answered is not written)."""
        if not errors:
            return
        array = (ctypes.c_int * len(errors))(*errors)
        self._lib.rd_kafka_mock_push_request_errors_array(
            self._handle(), api_key, len(errors), array
        )

    def clear_request_errors(self, api_key: int) -> None:
        self._lib.rd_kafka_mock_clear_request_errors(self._handle(), api_key)

    def close(self) -> None:
        with self._lock:
            cluster, self._cluster = self._cluster, None
            if cluster is None:
                return
            self._lib.rd_kafka_mock_cluster_destroy(cluster)
            self._lib.rd_kafka_destroy(self._rk)
