"""The buffer volume's directories: created and checked before anything opens them.

A missing mount, a path that is a file, or a read-only volume is a setting problem the user
fixes with ``--data-dir`` (or the pod's volume mount): one line, exit 2, not a traceback from
deep inside the WAL.
"""

from __future__ import annotations

import os
from pathlib import Path

from durable_producer.buffer_agent.errors import StartupError


def prepare_data_dir(data_dir: Path, subdirectories: tuple[Path, ...]) -> None:
    """Create ``data_dir`` and ``subdirectories`` (paths inside it) if needed; check that the
    agent may write there. Raises :class:`StartupError` naming ``--data-dir``."""
    for directory in (data_dir, *subdirectories):
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise StartupError(
                f"--data-dir {data_dir}: {directory} exists and is not a directory; point"
                " --data-dir (DURABLE_AGENT_DATA_DIR) at the buffer volume's mount"
            ) from None
        except OSError as error:
            raise StartupError(
                f"--data-dir {data_dir}: cannot create {directory} ({error.strerror}); point"
                " --data-dir (DURABLE_AGENT_DATA_DIR) at a writable buffer volume"
            ) from None
        if not os.access(directory, os.W_OK | os.X_OK):
            raise StartupError(
                f"--data-dir {data_dir}: {directory} is not writable by user id {os.getuid()};"
                " mount the buffer volume writable for the agent (fsGroup) or choose another"
                " --data-dir"
            )
