"""The agent process: WAL + Kafka-protocol ingest + forwarder + metrics, and its lifecycle.

``run``: measure the volume and fit the WAL limit to it (``volume/space.py``; a volume too small
for the WAL exits 2), answer ``/healthz`` and try the Kafka listener's addresses before the WAL
opens (recovery reads every frame: minutes for a large backlog), serve until SIGTERM/SIGINT,
then stop accepting, forward what is buffered until the drain deadline, checkpoint and exit 0;
whatever is left stays on the volume for the next owner. ``drain``: no listener; forward
everything on the volume and exit (for orphaned volumes; it needs no free space).

A full or failing disk never stops the agent: produce requests get a retriable error while
the WAL cannot take them (``wal/health.py``), forwarding goes on, and readiness stays true
(``ready``), so the application's pod is not taken out of its Services for a condition the
agent waits out by itself. The state is in ``durable_agent_refusing_appends{reason}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from durable_producer.buffer_agent.errors import StartupError
from durable_producer.buffer_agent.figures.forward_rate import (
    DrainOutlook,
    DrainWindow,
    RateSample,
)
from durable_producer.buffer_agent.figures.metrics import AgentMetrics
from durable_producer.buffer_agent.figures.metrics_server import MetricsServer
from durable_producer.buffer_agent.forward.dead_letter import (
    DeadLetterStore,
    read_dead_letters,
    unreadable_note,
)
from durable_producer.buffer_agent.forward.forwarder import DrainSummary, Forwarder
from durable_producer.buffer_agent.forward.health import ForwarderState
from durable_producer.buffer_agent.ingest.metadata import MetadataCache
from durable_producer.buffer_agent.ingest.server import IngestServer, try_binding
from durable_producer.buffer_agent.kafka.client_config import build_client_config
from durable_producer.buffer_agent.kafka.cluster_metadata import ClusterMetadataSource
from durable_producer.buffer_agent.process_tuning import prepare_to_serve
from durable_producer.buffer_agent.settings import AgentSettings
from durable_producer.buffer_agent.volume.space import (
    VolumeTooSmall,
    fit_wal_limit,
    free_bytes,
    measure_volume,
)
from durable_producer.buffer_agent.wal import WriteAheadLog
from durable_producer.contract import DRAIN_KEPT_DEAD_LETTERS_EXIT
from durable_producer.shutdown_record import ShutdownRecord, render

log = logging.getLogger(__name__)
PUBLISH_INTERVAL_S = 1.0


@dataclass(slots=True)
class StatsPublisher:
    """Copies WAL and ingest figures into the metrics once a second (the forwarder and the
    WAL's fsync observer update theirs directly), and with the forwarder's, the ingest and
    sustained forward rates, runway, time to drain and "cannot drain"
    (``figures/forward_rate.py``)."""

    wal: WriteAheadLog
    metrics: AgentMetrics
    ingest: IngestServer | None = None
    volume: Path | None = None
    forwarder: Forwarder | None = None
    drain_window: DrainWindow = field(default_factory=DrainWindow)
    _reported_ingest: tuple[int, int] = (0, 0)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _cannot_drain: bool = False

    def publish(self) -> None:
        """Once a second on the event loop, and before every scrape on the HTTP thread."""
        with self._lock:
            self._publish()

    def _publish(self) -> None:
        wal = self.wal.stats()
        if self.volume is not None:
            with contextlib.suppress(OSError):
                self.metrics.volume_free_bytes.set(free_bytes(self.volume))
        if self.ingest is not None:
            stats = self.ingest.stats
            records, size = self._reported_ingest
            self.metrics.ingest_records.inc(stats.records_appended - records)
            self.metrics.ingest_bytes.inc(stats.bytes_appended - size)
            self._reported_ingest = (stats.records_appended, stats.bytes_appended)
            self.metrics.publish_ingest(stats)
        outlook = self._drain_outlook()
        self.metrics.refresh_buffer(
            size_bytes=wal.size_bytes,
            max_bytes=wal.max_bytes,
            quarantined_segments=wal.quarantined_segments,
            backlog_records=wal.backlog_records,
            refusing=wal.refusing,
            net_fill_bytes_per_s=None if outlook is None else outlook.net_fill_bytes_per_s(),
        )
        if outlook is not None:
            self.metrics.drain.refresh(
                ingest=(outlook.ingest.records_per_s, outlook.ingest.bytes_per_s),
                forward=(outlook.forward.records_per_s, outlook.forward.bytes_per_s),
                cannot_drain=outlook.cannot_drain,
                time_to_drain_s=outlook.time_to_drain_s(wal.backlog_records),
            )
            if outlook.cannot_drain != self._cannot_drain:
                self._cannot_drain = outlook.cannot_drain
                level = logging.WARNING if outlook.cannot_drain else logging.INFO
                state = "cannot drain" if outlook.cannot_drain else "can drain again"
                log.log(level, "backlog %s: %s", state, outlook.message)

    def _drain_outlook(self) -> DrainOutlook | None:
        if self.ingest is None or self.forwarder is None:
            return None
        ingest, forwarded = self.ingest.stats, self.forwarder.stats()
        health = self.forwarder.health
        return self.drain_window.update(
            RateSample(
                at=time.monotonic(),
                ingest_records=ingest.records_appended,
                ingest_bytes=ingest.bytes_appended,
                forwarded_records=forwarded.forwarded_records,
                forwarded_bytes=forwarded.forwarded_bytes,
                waiting_frames=health.unread,
                delivering=health.state() is ForwarderState.DELIVERING,
            )
        )


def port_unusable(
    flag: str, host: str, port: int, error: OSError, metrics: tuple[str, int] | None = None
) -> StartupError:
    """The one-line error for a listener that cannot bind (``metrics``: the metrics listener's
    host and port, already bound, when the listener is the Kafka one)."""
    if isinstance(error, socket.gaierror):  # its errno is the resolver's (-2), no OS error
        return StartupError(
            f"{flag} {host}:{port}: cannot listen there (the name {host} does not resolve:"
            f" {error.strerror}); give an address of this host (127.0.0.1, 0.0.0.0, [::]) or"
            f" a name that resolves to one with {flag}"
        )
    if error.errno == errno.EADDRNOTAVAIL:
        hint = "it is no address of this host: give one of its own (or 0.0.0.0, [::] for all)"
    elif error.errno != errno.EADDRINUSE:
        hint = "check the address"
    elif metrics is not None and metrics[1] == port:  # another name of the same address
        hint = f"the agent's own --metrics-listen {metrics[0]}:{port} may hold it; give each a port"
    else:
        hint = "another process (another agent?) listens there; stop it or choose another port"
    reason = os.strerror(error.errno) if error.errno else str(error)
    return StartupError(f"{flag} {host}:{port}: cannot listen there ({reason}); {hint} with {flag}")


class BufferAgent:
    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings
        self.client_config = build_client_config(settings.kafka)
        self.metrics = AgentMetrics()
        self.wal: WriteAheadLog | None = None
        self.forwarder: Forwarder | None = None
        self.ingest: IngestServer | None = None
        self._publisher: StatsPublisher | None = None
        """The figures' publisher, once the WAL is open (the metrics server starts before)."""
        self._accepting = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def _snapshot_producer_state(self) -> None:
        """Runs on the forwarder thread before a checkpoint; the ingest lives on the loop."""
        if self.ingest is None or self._loop is None:
            return
        future = asyncio.run_coroutine_threadsafe(
            self.ingest.snapshot_producer_state(), self._loop
        )
        future.result(timeout=10)

    def _open_wal_and_forwarder(
        self, metadata: MetadataCache | None = None
    ) -> tuple[WriteAheadLog, Forwarder]:
        self.wal = WriteAheadLog.open(
            self.settings.agent.wal_dir,
            self.settings.wal,
            fsync_observer=self.metrics.fsync_seconds.observe,
        )
        self.metrics.record_wal_recovery(self.wal.recovery)
        self.forwarder = Forwarder(
            self.wal,
            self.client_config,
            dead_letters=DeadLetterStore(self.settings.agent.dead_letter_dir),
            state_dir=self.settings.agent.state_dir,
            metrics=self.metrics,
            config=self.settings.forwarder,
            before_checkpoint=self._snapshot_producer_state,
            topic_max_bytes=self._metadata_of_volume(metadata).max_message_bytes,
            on_topic_max_bytes=None if metadata is None else self._heard_max_bytes(metadata),
        )
        return self.wal, self.forwarder

    def _heard_max_bytes(self, metadata: MetadataCache) -> Callable[[str, int], None]:
        """What the forwarder's thread calls with a topic's limit Kafka told it: handed to
        the ingest's loop, which owns the cache (nothing once the loop is gone)."""
        loop = asyncio.get_running_loop()

        def heard(topic: str, limit: int) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: the agent is stopping
                loop.call_soon_threadsafe(metadata.heard_max_message_bytes, topic, limit)

        return heard

    def _metadata_of_volume(self, metadata: MetadataCache | None) -> MetadataCache:
        """The cached topic facts (a drain reads them from the volume; no cluster lookups)."""
        return metadata or MetadataCache(self.settings.agent.state_dir, None)

    def ready(self) -> bool:
        """Readiness: the listener accepts and the WAL is open. Not whether the WAL has room
        or its disk works: those refuse produce requests with a retriable error and pass by
        themselves (module docstring)."""
        return self._accepting and self.wal is not None and not self.wal.closed

    def _fit_wal_to_volume(self) -> None:
        """Lower ``--max-buffer-bytes`` to what the volume holds; ``StartupError`` (one line,
        exit 2, as every other start-up problem) if it holds no WAL."""
        agent, wal = self.settings.agent, self.settings.wal
        try:
            limit = fit_wal_limit(
                wal.max_bytes,
                measure_volume(agent.data_dir, agent.wal_dir),
                wal.segment_bytes,
                self.settings.ingest.max_batch_bytes,
            )
        except VolumeTooSmall as error:
            raise StartupError(f"--data-dir {agent.data_dir}: {error}") from None
        if limit.warning is not None:
            log.warning("%s: %s", agent.data_dir, limit.warning)
        self.settings = dataclasses.replace(
            self.settings, wal=dataclasses.replace(wal, max_bytes=limit.max_bytes)
        )

    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT; the exit code."""
        self._loop = asyncio.get_running_loop()
        self._fit_wal_to_volume()
        agent = self.settings.agent
        try:
            # Before the WAL opens: recovery reads every frame on the volume (minutes for a
            # large backlog on a slow disk), and the pod's startup probe asks /healthz for at
            # most 2 minutes; an agent killed for it would recover again, for ever. /readyz
            # says not ready until the WAL is open and the listener accepts.
            metrics_server = MetricsServer(
                self.metrics,
                host=agent.metrics_host,
                port=agent.metrics_port,
                ready=self.ready,
                before_scrape=self._publish_figures,
            ).start()
        except OSError as error:
            raise port_unusable(
                "--metrics-listen", agent.metrics_host, agent.metrics_port, error
            ) from None
        source: ClusterMetadataSource | None = None
        try:
            self._check_kafka_listener()
            source = ClusterMetadataSource(self.client_config)
            return await self._serve(metrics_server, source)
        finally:
            metrics_server.stop()
            # Its librdkafka client ends here, not as the process exits (which can crash
            # the exit: see ClusterMetadataSource). Called, not awaited: it runs even while
            # the run is being cancelled.
            if source is not None:
                source.close()

    def _check_kafka_listener(self) -> None:
        """Bind ``--listen``'s addresses and let them go, before the WAL opens (recovery can
        take minutes) and the forwarder talks to Kafka: a name that does not resolve or a port
        in use is then the first thing on stderr, not the last after the start-up's log. It
        listens for real only once the producers' sequences are restored (``_serve``), which
        still reports a port another process took meanwhile."""
        listen = self.settings.ingest
        try:
            try_binding(listen.host, listen.port)
        except OSError as error:
            raise self._kafka_listener_unusable(error) from None

    def _kafka_listener_unusable(self, error: OSError) -> StartupError:
        listen, agent = self.settings.ingest, self.settings.agent
        return port_unusable(
            "--listen", listen.host, listen.port, error, (agent.metrics_host, agent.metrics_port)
        )

    def _publish_figures(self) -> None:
        if self._publisher is not None:
            self._publisher.publish()

    async def _serve(self, metrics_server: MetricsServer, source: ClusterMetadataSource) -> int:
        agent = self.settings.agent
        metadata = MetadataCache(
            agent.state_dir, source, default_partitions=agent.default_partitions
        )
        log.info("opening the WAL in %s: recovery reads every frame first", agent.wal_dir)
        opening = time.monotonic()
        wal, forwarder = self._open_wal_and_forwarder(metadata)
        stats = wal.stats()
        log.info(
            "WAL open in %.1f s: %d frames (%d records) above the checkpoint, %.1f MiB",
            time.monotonic() - opening,
            stats.backlog_frames,
            stats.backlog_records,
            stats.size_bytes / 2**20,
        )
        self.ingest = IngestServer(wal, metadata, agent.state_dir, self.settings.ingest)
        publisher = self._publisher = StatsPublisher(
            wal, self.metrics, self.ingest, agent.data_dir, forwarder
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        try:
            # Sequence state first: the forwarder's checkpoints snapshot it (and delete the
            # WAL frames a restore replays), so it starts only once the state is whole.
            await self.ingest.restore()
            self.metrics.record_state_damage([*self.ingest.state_damage, *forwarder.state_damage])
            forwarder.start()
            try:
                await self.ingest.listen()
            except OSError as error:
                raise self._kafka_listener_unusable(error) from None
            prepare_to_serve()
            self._accepting = True
            log.info(
                "agent ready: Kafka protocol on %s, metrics on %s:%d, forwarding to %s",
                self.ingest.bootstrap,
                agent.metrics_host,
                metrics_server.port,
                self.client_config.get("bootstrap.servers"),
            )
            while not stop.is_set():
                publisher.publish()
                if forwarder.failure is not None:
                    log.error("forwarder stopped: %s", forwarder.failure)
                    return 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), PUBLISH_INTERVAL_S)
            log.info(
                "shutdown requested: no longer accepting, draining for up to %.0f s",
                agent.drain_timeout_s,
            )
            self._accepting = False
            await self.ingest.stop()
            summary = await asyncio.to_thread(forwarder.drain, agent.drain_timeout_s)
            publisher.publish()
            self._log_drain(summary)
            self._leave_shutdown_record(summary, wal)
            return 0
        finally:
            self._accepting = False
            if self.ingest is not None:
                await self.ingest.stop()
            if forwarder.running:
                await asyncio.to_thread(forwarder.stop)
            wal.close()

    def drain(self, timeout_s: float) -> int:
        """Forward everything on the volume; exit code 0 when all of it reached Kafka and
        the volume is empty, 1 when the time ran out, ``DRAIN_KEPT_DEAD_LETTERS_EXIT`` when dead
        letters are still on it."""
        wal, forwarder = self._open_wal_and_forwarder()
        try:
            started = time.monotonic()
            summary = forwarder.drain(timeout_s)
            self._log_drain(summary)
            log.info("drain finished in %.1f s", time.monotonic() - started)
            if not summary.complete:
                return 1
            kept = read_dead_letters(self.settings.agent.dead_letter_dir)
            if kept.letters or kept.unreadable:
                # The operator deletes a volume whose drain succeeded: these would go with it.
                log.error(
                    "the volume is not empty: %d dead letter(s) Kafka refused%s are still in"
                    " %s; re-send them once the cause is fixed (durable-agent dead-letters"
                    " resend) or remove the handled ones, then drain again",
                    len(kept.letters),
                    unreadable_note(kept.unreadable),
                    self.settings.agent.dead_letter_dir,
                )
                return DRAIN_KEPT_DEAD_LETTERS_EXIT
            return 0
        finally:
            if forwarder.running:
                forwarder.stop()
            wal.close()

    def _leave_shutdown_record(self, summary: DrainSummary, wal: WriteAheadLog) -> None:
        """Say in the termination message whether the volume is left empty (shutdown_record.py):
        the operator then lets it go without a drain Job. Only where Kubernetes made the file."""
        path = self.settings.agent.termination_message_path
        if not path.is_file():
            return
        stats = wal.stats()
        letters = read_dead_letters(self.settings.agent.dead_letter_dir)
        record = ShutdownRecord(
            drained=summary.complete,
            backlog_records=stats.backlog_records,
            dead_letters=len(letters.letters) + len(letters.unreadable),
            quarantined_segments=stats.quarantined_segments,
        )
        try:
            path.write_text(render(record) + "\n")
        except OSError as error:
            log.warning("could not write the shutdown record to %s: %s", path, error)
            return
        log.info("left the volume %s", "empty" if record.volume_empty else "holding data")

    @staticmethod
    def _log_drain(summary: DrainSummary) -> None:
        outcome = "complete" if summary.complete else "INCOMPLETE (the rest stays on the volume)"
        log.info(
            "drain %s: checkpoint %d of %d, %d records forwarded, %d dead letters, "
            "%d possible duplicates, %.1f s",
            outcome,
            summary.checkpoint_offset,
            summary.target_offset,
            summary.forwarded_records,
            summary.dead_letters,
            summary.possible_duplicates,
            summary.elapsed_s,
        )
