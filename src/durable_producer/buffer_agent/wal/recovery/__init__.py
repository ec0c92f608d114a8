"""The WAL's side room: opening a directory whatever a crash or a bad disk left, and reporting it.

Not on the append or read path. ``WriteAheadLog.open`` (``writer.py``) takes the lock and calls
``repair.recover_log``; the agent's start-up and ``durable-agent wal inspect`` are the only
callers outside ``wal/`` (an import-linter contract in ``pyproject.toml``). One job per module:

- ``repair.py``: brings the directory to a consistent state on open (carries the decisions out)
- ``scan.py``: reads a whole segment file back: valid frames and damage
- ``damage.py``: decides (read-only) what is damaged, lost and done
- ``quarantine.py``: moves files aside with their JSON records, and the figures they add up to
- ``lock.py``: the exclusive directory lock (a stray in its place is moved aside)
- ``inspect.py``: the read-only ``durable-agent wal inspect`` report
"""
