"""The buffer volume as a whole: what is on it and how any file on it is written.

Below the WAL and below ``ingest/`` and ``forward/``, which keep their own state files here
through these modules instead of through WAL internals. One job per module:

- ``format.py``: THE on-disk format of the whole volume (layout, segments, frames, checkpoint,
  forwarder hint, quarantine records, state files); every reader and writer imports from it
- ``directories.py``: the volume's directories, created and checked at start (``--data-dir``)
- ``space.py``: the volume as ``statvfs`` sees it, and the WAL size limit that fits on it
- ``atomic_file.py``: replace a file whole (temp file, fsync, rename, fsync the directory)
- ``slot_file.py``: two-slot files rewritten in place (the checkpoint, the forwarder hint)
- ``state_file.py``: reading the JSON state files in ``DATA/state/`` without stopping the agent
"""
