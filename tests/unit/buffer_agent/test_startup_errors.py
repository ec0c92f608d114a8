"""Start-up failures of ``durable-agent``: one line naming the flag and the value, exit 2.

docs/agent.md and the runbook promise this; before, each case below ended in a traceback
and exit code 1.
"""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
import termios
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_producer.buffer_agent import agent
from durable_producer.buffer_agent.cli import main
from durable_producer.buffer_agent.kafka import cluster_metadata
from durable_producer.buffer_agent.wal import WriteAheadLog
from support.agent_args import UNREACHABLE_KAFKA, run_args
from support.threads import clients_freed
from support.tls_files import client_tls_files
from support.wal_helpers import SMALL, payload_for


def run_agent(tmp_path: Path, *flags: str) -> list[str]:
    return run_args(tmp_path / "volume", "--log-level", "ERROR", *flags)


def single_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("durable-agent:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err, err
    return lines[0]


@pytest.fixture()
def busy_port() -> Iterator[int]:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        yield holder.getsockname()[1]
    finally:
        holder.close()


def test_a_buffer_limit_below_two_segments_names_the_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(run_agent(tmp_path, "--max-buffer-bytes", "10")) == 2
    line = single_error_line(capsys)
    assert "--max-buffer-bytes=10" in line
    assert "two segments" in line


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--fsync-interval-ms", "9300000000000"),  # ended the fsync thread: acked without fsync
        ("--request-timeout", "2147484"),  # Produce requests failed to encode, retried for ever
    ],
)
def test_a_time_beyond_its_bound_names_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    assert main(run_agent(tmp_path, flag, value)) == 2
    assert f"{flag}={value}" in single_error_line(capsys)


def test_a_data_dir_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "volume").write_text("not a directory")
    assert main(run_agent(tmp_path)) == 2
    line = single_error_line(capsys)
    assert f"--data-dir {tmp_path / 'volume'}" in line
    assert "not a directory" in line


def test_a_data_dir_that_cannot_be_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    args = run_agent(tmp_path)
    args[args.index("--data-dir") + 1] = str(blocker / "volume")
    assert main(args) == 2
    line = single_error_line(capsys)
    assert f"--data-dir {blocker / 'volume'}" in line
    assert "cannot create" in line


def test_drain_on_a_data_dir_that_is_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "volume").write_text("")
    args = ["drain", "--kafka-bootstrap", UNREACHABLE_KAFKA, "--data-dir", str(tmp_path / "volume")]
    assert main(args) == 2
    assert "--data-dir" in single_error_line(capsys)


def test_the_kafka_listen_port_in_use(
    tmp_path: Path, busy_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    args = run_agent(tmp_path)
    args[args.index("--listen") + 1] = f"127.0.0.1:{busy_port}"
    assert main(args) == 2
    line = single_error_line(capsys)
    assert f"--listen 127.0.0.1:{busy_port}" in line
    assert "in use" in line


def test_the_kafka_listen_port_under_another_name_of_the_metrics_address(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """localhost and 127.0.0.1 on one port: the settings cannot tell that the two names meet,
    and the line blamed "another process (another agent?)" for the agent's own listener."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    args = run_agent(tmp_path)
    args[args.index("--listen") + 1] = f"localhost:{port}"
    args[args.index("--metrics-listen") + 1] = f"127.0.0.1:{port}"
    assert main(args) == 2
    line = single_error_line(capsys)
    assert f"--listen localhost:{port}" in line and "in use" in line
    assert f"the agent's own --metrics-listen 127.0.0.1:{port} may hold it" in line
    assert "another process" not in line


def test_a_failed_start_frees_its_librdkafka_client(
    tmp_path: Path, busy_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The agent's metadata client is destroyed before ``main`` returns, not left to the
    # process's exit (a librdkafka client alive then can crash the exit: SIGSEGV). The
    # collector is off: only a dropped last reference frees it. The port is found busy only
    # when the agent listens, as when another process takes it after the check at start.
    monkeypatch.setattr(agent, "try_binding", lambda host, port: None)
    args = run_agent(tmp_path)
    args[args.index("--listen") + 1] = f"127.0.0.1:{busy_port}"
    with clients_freed(monkeypatch, cluster_metadata, "AdminClient") as destroyed:
        assert main(args) == 2
        assert len(destroyed) == 1


def test_the_metrics_port_in_use(
    tmp_path: Path, busy_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    args = run_agent(tmp_path)
    args[args.index("--metrics-listen") + 1] = f"127.0.0.1:{busy_port}"
    assert main(args) == 2
    line = single_error_line(capsys)
    assert f"--metrics-listen 127.0.0.1:{busy_port}" in line
    assert "in use" in line
    # the WAL it had opened was closed again: a second agent can take the volume
    WriteAheadLog.open(tmp_path / "volume" / "wal", SMALL).close()


@pytest.mark.parametrize(
    ("variable", "value", "flag"),
    [
        ("DURABLE_AGENT_FSYNC", "bogus", "--fsync"),
        ("DURABLE_AGENT_SEGMENT_BYTES", "abc", "--segment-bytes"),
        ("DURABLE_AGENT_CHECKPOINT_INTERVAL", "nan", "--checkpoint-interval"),
    ],
)
def test_an_unusable_environment_variable_names_variable_value_and_flag(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    variable: str,
    value: str,
    flag: str,
) -> None:
    monkeypatch.setenv(variable, value)
    assert main(run_agent(tmp_path)) == 2
    line = single_error_line(capsys)
    assert f"{variable}={value!r}" in line
    assert flag in line


def test_the_installed_command_prints_no_traceback(tmp_path: Path) -> None:
    env = dict(os.environ, DURABLE_AGENT_SEGMENT_BYTES="abc")
    done = subprocess.run(
        [sys.executable, "-m", "durable_producer.buffer_agent.cli", *run_agent(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "durable-agent: DURABLE_AGENT_SEGMENT_BYTES='abc': 'abc' is not a whole number"
        " (the variable sets --segment-bytes)"
    ]


def test_wal_inspect_on_the_volume_root_points_at_the_wal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with WriteAheadLog.open(tmp_path / "wal", SMALL) as wal:
        wal.append("t", 0, payload_for(1, 100))
    assert main(["wal", "inspect", str(tmp_path)]) == 2
    line = single_error_line(capsys)
    assert f"no WAL in {tmp_path}" in line
    assert f"try {tmp_path / 'wal'}" in line


def test_wal_inspect_on_an_empty_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["wal", "inspect", str(tmp_path)]) == 2
    line = single_error_line(capsys)
    assert f"no WAL in {tmp_path}" in line
    assert "<data-dir>/wal" in line


def test_a_recovered_wal_that_cannot_be_fsynced_is_one_line_and_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with WriteAheadLog.open(tmp_path / "volume" / "wal", SMALL) as log:
        log.append("t", 0, payload_for(0))

    def failing_fdatasync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing_fdatasync)
    assert main(run_agent(tmp_path)) == 1
    assert "could not fsync the recovered WAL" in single_error_line(capsys)


def test_a_bad_variable_stops_only_the_commands_that_read_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DURABLE_AGENT_TIMEOUT", "abc")  # --timeout is a flag of drain only
    with pytest.raises(SystemExit) as helped:
        main(["run", "--help"])
    assert helped.value.code == 0
    assert main(["dead-letters", "list", "--data-dir", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["drain", "--kafka-bootstrap", UNREACHABLE_KAFKA]) == 2
    line = single_error_line(capsys)
    assert "DURABLE_AGENT_TIMEOUT='abc'" in line
    assert "--timeout" in line
    with pytest.raises(SystemExit) as refused:  # a flag given wins over the variable
        main(["drain", "--kafka-bootstrap", UNREACHABLE_KAFKA, "--timeout", "-1"])
    assert refused.value.code == 2
    assert "argument --timeout: -1 must be positive" in capsys.readouterr().err


def test_a_bad_data_dir_variable_for_the_dead_letter_list_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """It printed the usage and "argument --data-dir: an empty path", a flag never given."""
    monkeypatch.setenv("DURABLE_AGENT_DATA_DIR", "")
    assert main(["dead-letters", "list"]) == 2
    line = single_error_line(capsys)
    assert "DURABLE_AGENT_DATA_DIR=''" in line and "--data-dir" in line


def test_kafka_settings_are_named_by_the_flags_that_set_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The line named the config's fields (sasl_mechanism, security_protocol)."""
    assert main(run_agent(tmp_path, "--sasl-mechanism", "PLAIN")) == 2
    line = single_error_line(capsys)
    assert "--sasl-mechanism given but --security-protocol is PLAINTEXT" in line, line


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ("linger.ms", "'linger.ms' (--kafka-setting) is not of the form key=value"),
        ("enable.idempotence=false", "'enable.idempotence' (--kafka-setting) is not allowed"),
        ("security.protocol=SSL", "(--kafka-setting) conflicts with a structured setting: use"),
    ],
)
def test_a_bad_kafka_setting_is_named_by_its_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], setting: str, said: str
) -> None:
    """The line said "extra setting 'linger.ms'", a name no flag or variable has."""
    assert main(run_agent(tmp_path, "--kafka-setting", setting)) == 2
    line = single_error_line(capsys)
    assert said in line, line


@pytest.mark.parametrize("command", [["drain"], ["dead-letters", "resend"]])
def test_a_command_that_empties_a_volume_wants_one_that_exists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    typo = tmp_path / "no-such-volume"
    args = [*command, "--kafka-bootstrap", UNREACHABLE_KAFKA, "--data-dir", str(typo)]

    assert main(args) == 2

    line = single_error_line(capsys)
    assert f"no buffer volume at {typo} (--data-dir): no such directory" in line
    assert not typo.exists()  # nothing made there, nothing reported drained


def test_a_file_of_the_volume_that_is_a_directory_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    volume = tmp_path / "volume"
    (volume / "state" / "forwarder.hint").mkdir(parents=True)
    args = ["drain", "--kafka-bootstrap", UNREACHABLE_KAFKA, "--data-dir", str(volume)]

    assert main([*args, "--timeout", "1", "--log-level", "ERROR"]) == 2

    line = single_error_line(capsys)
    assert f"{volume / 'state' / 'forwarder.hint'}: Is a directory" in line
    assert "cannot use this file of the buffer volume" in line


def test_an_encrypted_key_without_its_password_never_prompts_on_the_terminal(
    tmp_path: Path,
) -> None:
    """With a terminal (a container started with a TTY) OpenSSL printed "Enter PEM pass
    phrase:" and the agent waited there for ever; the agent here has one as its controlling
    terminal, the one OpenSSL asks on."""
    certificate, key = client_tls_files(tmp_path, "s3cret")
    command = [
        sys.executable,
        "-m",
        "durable_producer.buffer_agent.cli",
        *run_agent(tmp_path, "--security-protocol", "SSL", "--ssl-cert-file", str(certificate)),
        "--ssl-key-file",
        str(key),
    ]
    primary, terminal = os.openpty()
    try:
        done = subprocess.run(
            command,
            stdin=terminal,
            capture_output=True,
            text=True,
            timeout=30,
            start_new_session=True,  # a session of its own, the terminal its controlling one
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
        )
    finally:
        os.close(primary)
        os.close(terminal)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"durable-agent: invalid Kafka connection settings: --ssl-key-file {str(key)!r} is an"
        " encrypted key: give the file that holds its password with --ssl-key-password-file"
    ]


@pytest.mark.parametrize("command", ["run", "drain"])
@pytest.mark.parametrize("flag", ["--sasl-username-file", "--sasl-password-file"])
def test_a_secret_file_of_random_bytes_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, flag: str
) -> None:
    """A UnicodeDecodeError traceback, exit 1."""
    random = tmp_path / "random"
    random.write_bytes(b"\x99" + os.urandom(499))
    good = tmp_path / "good"
    good.write_text("writer\n")
    secrets = {"--sasl-username-file": str(good), "--sasl-password-file": str(good)}
    secrets[flag] = str(random)
    flags = [
        "--security-protocol",
        "SASL_PLAINTEXT",
        "--sasl-mechanism",
        "PLAIN",
        *(word for pair in secrets.items() for word in pair),
    ]
    (tmp_path / "volume").mkdir()  # drain wants a volume that exists
    volume = ["--data-dir", str(tmp_path / "volume")]
    args = (
        run_agent(tmp_path, *flags)
        if command == "run"
        else ["drain", "--kafka-bootstrap", UNREACHABLE_KAFKA, *volume, *flags]
    )
    assert main(args) == 2
    assert single_error_line(capsys) == (
        f"durable-agent: invalid Kafka connection settings: {flag} {str(random)!r} is not"
        " UTF-8 text (byte 0x99 at offset 0): the file must hold the secret itself, as text"
    )


@pytest.mark.parametrize("flag", ["--listen", "--metrics-listen"])
@pytest.mark.parametrize("host", ["nosuchhost.invalid", "256.1.1.1"])
def test_a_listen_host_that_does_not_resolve_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, host: str
) -> None:
    """The line said "cannot listen there (Unknown error -2)": the resolver's negative error
    code read as an OS error number."""
    args = run_agent(tmp_path)
    args[args.index(flag) + 1] = f"{host}:47092"
    assert main(args) == 2
    line = single_error_line(capsys)
    assert line.startswith(
        f"durable-agent: {flag} {host}:47092: cannot listen there (the name {host} does not"
        " resolve: "
    ), line
    assert line.endswith(
        f"); give an address of this host (127.0.0.1, 0.0.0.0, [::]) or a name that resolves"
        f" to one with {flag}"
    ), line


def test_the_kafka_listener_is_checked_before_the_wal_opens(tmp_path: Path) -> None:
    """It failed only once the WAL was open (recovery can take minutes) and the forwarder had
    tried Kafka: six log lines came first, and the WAL was opened for nothing."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        for listen in (f"127.0.0.1:{port}", "nosuchhost.invalid:47092"):
            args = run_agent(tmp_path / listen, "--log-level", "INFO")
            args[args.index("--listen") + 1] = listen
            done = subprocess.run(
                [sys.executable, "-m", "durable_producer.buffer_agent.cli", *args],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 2
            assert len(done.stderr.splitlines()) == 1, done.stderr
            assert done.stderr.startswith(f"durable-agent: --listen {listen}: cannot listen")
            assert not any((tmp_path / listen / "volume" / "wal").iterdir())
