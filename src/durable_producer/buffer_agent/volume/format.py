"""THE on-disk format of the buffer volume: what every file is, byte for byte.

This is the one place the format is written down; the modules that read and write the files
import their names, magics and structs from here. Changing anything below changes the format:
volumes written by an older agent must keep opening, so add a new magic rather than reinterpret
an old one.

Volume layout
=============

The buffer volume is mounted at ``DATA`` (``--data-dir``; ``/var/lib/durable-producer`` in a
pod, see ``durable_producer.contract.DATA_DIR``). The agent keeps three directories in it::

    DATA/
      wal/                                the write-ahead log (this package)
        LOCK                              flock(2) of the one agent using the volume
        checkpoint                        two checkpoint slots, 1024 bytes
        id                                the log's id: 32 hex digits and a newline
        00000000000000000000.seg          segments, named by their base offset, oldest first
        00000000000000001742.seg
        quarantine/                       damaged segments moved aside
          00000000000000000000.seg.20250102T030405Z-123456        the original file
          00000000000000000000.seg.20250102T030405Z-123456.json   why, and what was lost
      state/                              small JSON files of the ingest and forward parts
        producer_ids.json
        producer_state.json
        metadata.json
        forwarder.hint
        producer-identity                 binary: two slots, see forward/identity.py
      dead-letter/                        batches Kafka refused for good
        dead-letters.jsonl
        resent.jsonl

Transient names, removed or replaced whenever they are met: ``<segment>.rebuild`` (a salvaged
segment being written, removed on open), ``.<name>.tmp`` (the temporary file of an atomic
replace: write, fsync, rename over ``<name>``, fsync the directory; in ``wal/`` removed on open;
elsewhere removed when the replace fails), and, from agents before ``forwarder.hint``,
``forwarder.json`` and ``.forwarder.json.fast`` (removed once the new hint is written).

All integers below are unsigned big-endian unless marked signed (the Kafka protocol's byte
order). CRCs are CRC32C (Castagnoli), as Kafka record batches use.

``wal/LOCK``
------------
Held with ``flock(LOCK_EX | LOCK_NB)`` for as long as an agent has the log open (the kernel
releases it when the process dies). Its content is informational only: the text
``pid=<pid> host=<hostname>\\n`` of the holder, shown to a second agent that is refused and by
``durable-agent wal inspect``.

Segments: ``wal/<base offset>.seg``
-----------------------------------
Named by their base offset (the offset of the first frame written to them) in 20 zero-padded
decimal digits plus ``.seg`` (``00000000000000001742.seg``), so names sort in offset order.
Offsets are at most ``MAX_OFFSET`` (2**63 - 1); a name above it is not a segment of this log. A
segment is::

    segment header   16 bytes
      magic          8   b"DPWALSG1"
      base_offset    8   the offset in the file name
    frame, frame, ...    offsets strictly increasing, none below base_offset

The header carries no information of its own: the file name gives the base offset and every frame
carries its own offset and CRC. So the header needs no redundancy (and has no CRC, which keeps
volumes of every agent version readable): a damaged header costs no frame. Recovery reads the
frames of a segment whose header is wrong, and the rebuilt segment gets a header written from the
name (see quarantine below).

Appends go to the newest segment only. Before a frame would take the newest segment past
``segment_bytes`` (``WalConfig``) a new segment is started with the next offset as its base,
unless the newest one holds no frame yet (so a segment can exceed ``segment_bytes`` by less than
one frame). Frames are never split across segments. Offsets are consecutive across the log;
a gap means frames were lost to damage and are listed in a quarantine record. A segment is
deleted once the next segment's base offset is at or below the checkpoint (all its frames are
delivered). Only the newest segment may end in an incomplete frame (a crash mid-write) or hold
nothing but a short or damaged header (a crash while it was created); opening the log truncates
the former and rewrites the latter's header.

What is damage and what is a crash (``wal/recovery/scan.py``, ``damage.py``): bytes that do not
decode as a frame, followed by a valid frame, are damage (corruption). At the end of the newest
segment, an incomplete frame (the file ends inside it) or zeros are a torn write, truncated: never
acknowledged under ``fsync=always``, inside the promised loss window under ``interval`` and
``never``. But under ``always`` a *complete* frame there (its declared length fits in the file, or
its CRC holds over the rest of the file) whose CRC fails was acknowledged: that is corruption,
quarantined and reported with its offset, and its offset is never reused. Frames are lost only
where damaged bytes are; the offsets reported lost are worked out from evidence only (the valid
frames around the damage, the next segment's name, the checkpoint), never guessed.

Names in ``wal/`` that are not part of the log: a segment-shaped name above ``MAX_OFFSET``, a
segment-shaped directory (or other non-file, also in place of ``checkpoint``, ``id`` or
``LOCK``), a file with neither a valid header nor a valid
frame whose name does not continue the log, or a segment that overlaps offsets of an earlier one,
is moved to ``quarantine/`` with a reason record (``lost_frames`` 0). Any other unknown name
(``foo.seg``, ``00000000000000000000.seg.tmp``, stray files) is left alone, named in one warning
each time the log is opened.

Frames
------
One frame is one produce batch exactly as the client sent it::

    prefix           12 bytes
      magic           4   b"\\xd7WF1" (d7 57 46 31): lets recovery find the next frame after damage
      body_length     4   bytes after the prefix: 26 + topic_length + payload length (<= 2**31)
      crc32c          4   CRC32C of payload, continued over offset .. topic (see below)
    body
      offset          8   the frame's WAL offset
      partition       4   signed: the Kafka partition the client chose
      record_count    4   records in the payload (backlog figures)
      appended_ms     8   wall-clock time of the append, ms since the epoch (oldest-unsent age)
      topic_length    2   at most 996 (249 characters of up to 4 UTF-8 bytes)
      topic               topic_length bytes of UTF-8
      payload             the Kafka record batch (v2) bytes, untouched

The CRC is ``crc32c(offset .. topic, initial=crc32c(payload))``: the CRC of the payload
followed by the 26 + topic_length bytes from ``offset`` to the end of ``topic``. The payload's
part is computed before the offset is assigned, outside the append lock. A frame is valid when
its magic, length limits and CRC hold and its topic decodes as UTF-8. A frame header is 38 bytes
plus the topic.

``wal/checkpoint``
------------------
"Every frame below this offset was delivered to Kafka": the offset where the forwarder resumes.
A 1024-byte file, preallocated, holding two slots at bytes 0 and 512 (one disk sector each)::

    slot             28 bytes
      magic           8   b"DPWALCK2"
      sequence        8   1 for the first write, +1 for each
      offset          8   the checkpoint
      crc32c          4   CRC32C of the 24 bytes before it

Write number ``sequence`` goes in place to the slot at ``(sequence % 2) * 512`` followed by
fdatasync, so a torn write can only damage the slot being written. On reading, the valid slot
(magic and CRC hold) with the highest sequence wins. No file, or no valid slot, means no
checkpoint: the forwarder replays from the oldest segment (duplicates, never loss).

``wal/id``
----------
The log's id (``wal/log_id.py``): 32 lowercase hex digits (128 random bits) and a newline,
written with the atomic replace when the log is opened without one. Marks kept outside the
log name it (``producer-identity``'s and ``producer_state.json``'s ``wal_id``) and are used
only with the same id, so that a WAL recreated beside a kept ``state/`` (offsets from 0
again) is never taken for the old one. A log from before ids (frames, no id) gets one on its
first open followed by the line ``adopted``: marks naming no id (an older agent's) are used
with it, on that open and every later one. An unreadable file (other content, a directory,
which recovery moves to ``quarantine/``) is replaced by a new id, not adopted; one the agent
may not read (mode, owner) or cannot read (an I/O error) stops the open, and is kept.

``wal/quarantine/``
-------------------
A segment with damage that is not a torn tail (bad bytes followed by valid frames, any damage
in an older segment, a bad header, or a corrupt complete last frame under ``fsync=always``) is
kept here under ``<segment name>.<stamp>``, where the stamp is the UTC time ``YYYYmmddTHHMMSSZ``
and ``-`` plus six digits to keep names unique. The valid frames are salvaged into a rebuilt
segment of the same name in ``wal/``, with a header written from the name (an older segment left
with no valid frame is not rebuilt). Entries that are not part of the log (above) are moved here
the same way. Beside each, ``<name>.<stamp>.json`` says what happened; the number of ``.json``
files is the ``quarantined_segments`` figure, the sum of their ``lost_frames`` the
``wal_lost_frames`` one. Each ``lost_offsets`` entry is one damaged run of bytes,
``"<first>..<last> (<problem> at byte <position>)"``; a bad header over a segment with no frame
gives ``"<first>..<last> (<problem>)"``. Offsets below the checkpoint (delivered) are never listed::

    {
      "segment": "00000000000000000000.seg",          the name in wal/
      "base_offset": 0,                                 from the name (null if it has none)
      "quarantined_file": "00000000000000000000.seg.20250102T030405Z-123456",
      "reason": "damaged segment",                      or why it is not part of the log
      "damage": ["bytes 1234..1300: CRC32C mismatch"],  every damaged run, header included
      "lost_offsets": ["4..4 (CRC32C mismatch at byte 1234)"],
      "lost_frames": 1,                                  offsets in lost_offsets
      "salvaged_frames": 8,                              valid frames copied back into wal/
      "salvaged_offsets": "0..8",                        first..last salvaged, or null
      "time": "20250102T030405Z-123456"                  the stamp
    }

Records written before ``reason``, ``damage`` and ``lost_frames`` existed lack them; their lost
frames are counted from ``lost_offsets``.

``state/`` (written by the ingest part with the atomic replace above, by the forwarder in place)
-------------------------------------------------------------------------------------------
Each name below is a constant of the package that owns the file (grep for it).

- ``producer_ids.json`` (``PRODUCER_IDS_FILE``, ``ingest/``): ``{"next_unreserved": N}``.
  Producer ids are handed out below N; a block's end is stored before any id of it is used.
- ``producer_state.json`` (``PRODUCER_STATE_FILE``, ``ingest/``): the idempotence snapshot,
  ``{"version": 1, "wal_offset": S, "wal_id": W, "producers": {"<producer id>": {"epoch": E,
  "last_seen": <unix seconds>, "partitions": [[topic, partition, [[base_sequence,
  last_sequence, wal_offset], ...]], ...]}}}``. WAL frames at or above S are replayed on
  start to bring it up to date. Used only for the WAL whose id (``wal/id``) is W (a snapshot
  without W, from an older agent, only for a WAL whose id is marked ``adopted``);
  otherwise the state is rebuilt from the WAL alone.
- ``metadata.json`` (``METADATA_FILE``, ``ingest/``): the cluster's partition counts and each
  topic's ``max.message.bytes`` where the cluster said it (DescribeConfigs), ``{"version": 1,
  "topics": {"<topic>": {"partitions": N, "refreshed_at": <unix seconds>,
  "max_message_bytes": M or null}}}`` (entries of older agents lack ``max_message_bytes``).
- ``forwarder.hint`` (``HINT_FILE``, ``forward/``): the forwarder's hint, a two-slot file like
  ``wal/checkpoint`` (1024 bytes, slots at 0 and 512, rewritten in place, so it needs no new
  block on a full disk) whose slot is 36 bytes: magic ``b"DPFWDHT1"`` (8), sequence (8),
  ``sent_high`` (8), ``delivered_high`` (8), crc32c of the 32 bytes before it (4).
  ``sent_high`` is one past the last frame of a Produce request to a connected broker,
  ``delivered_high`` one past the last delivered. Rewritten every ``hint_interval_s``
  without fsync and at every checkpoint and stop with fdatasync. Frames between the
  checkpoint and ``sent_high`` are counted as possible duplicates when replayed. Agents
  before it kept the same two numbers in ``forwarder.json`` (``{"sent_high": N,
  "delivered_high": M}``, replaced with a rename):
  read when ``forwarder.hint`` has no valid slot, removed once it has one.
- ``producer-identity`` (``IDENTITY_FILE``, ``forward/identity.py``): the forwarding
  producer's identity, so that a restart after a crash sends nothing twice. Two slots of
  ``SLOT_BYTES`` (64 KiB; both larger, through a new file written with the atomic replace,
  when a record does not fit), preallocated and rewritten alternately in place; write
  ``sequence`` goes to slot ``sequence % 2``. A slot: magic ``b"DPID"`` (4), sequence (8,
  big-endian), payload length (4), CRC-32 (zlib) of the payload (4), then the payload, JSON:
  ``{"producer_id", "epoch", "delivered_below", "sent_below", "written_checkpoint",
  "written_ms", "wal_id", "partitions": [[topic, partition, producer_id, epoch, offset,
  sequence], ...], "topic_ids", "gaps", "gap_reasons"}``
  (every frame below ``delivered_below`` is in Kafka; no frame at or above ``sent_below`` was
  ever sent; a partition's first frame at or after ``offset`` is numbered ``sequence``). The
  valid slot with the higher sequence wins; the record is used only for the WAL named by
  ``wal_id`` (``wal/id``; a record without it, from an older agent, only for a WAL whose id
  is marked ``adopted``) while its checkpoint lies between
  ``written_checkpoint`` and ``delivered_below``. fdatasync'ed only
  when the producer id or epoch changes. A file that cannot be read, or holds no valid slot
  (other than all zeros: created, never written), is moved aside to
  ``producer-identity.damaged`` (``volume/state_file.py``) and the forwarder takes a new
  producer id. ``delivery-marks``, the per-record forwarder's file, is ignored and removed
  on the first write.

``dead-letter/`` (``DEAD_LETTERS_FILE``, ``RESENT_FILE``, ``TAKEN_FILE``: ``dead_letter.py``)
--------------------------------------------------------------------------------------------
Append-only JSON lines, fsynced after every line; a torn last line (a crash mid-append, no
newline after it, not whole) is skipped on reading and cut off by the next append (agents
before 2026-12-05 closed it with a newline and wrote on: such a line, the start of a line
``{"id":...`` without its closing ``}``, is skipped too, as is one beginning with zeros or a
line's start holding them: an append never fsynced). Any other line that holds no letter or
mark is damage: listed as such, never passed over (``read_dead_letters``).

- ``dead-letters.jsonl``: one refused client batch whole (``"<wal_offset>-<batch index in the
  frame>"``, ``payload`` the batch as stored, the record fields null), or one undecodable frame;
  letters of the per-record forwarder of earlier agents hold one record each. A line:
  ``{"id": "<wal_offset>-<record_index>" or "<wal_offset>-frame", "recorded_ms", "wal_offset",
  "topic", "partition", "record_index" (null for a frame), "reason", "error_code",
  "timestamp_ms", "key", "value", "headers": [[name, value], ...], "payload" (the whole record
  batch of an undecodable frame, else null)}``; bytes are base64 strings or null.
- ``resent.jsonl``: ``{"id": ..., "recorded_ms": ..., "resent_ms": ...}`` for every dead
  letter re-sent successfully, naming it by its id and ``recorded_ms`` (another letter of the
  same id, from a WAL made again, is not marked; marks of older agents lack ``recorded_ms``
  and mark every letter of their id recorded before their ``resent_ms``).
- ``taken.jsonl``: ``{"id": ..., "recorded_ms": ..., "batches": N}`` for a letter of several
  batches whose resend Kafka refused after taking its first N (N >= 1): the next resend sends
  the rest. A file of its own: agents before 2026-12-06 do not read it (each read any line of
  ``resent.jsonl`` as a re-sent mark, as damage, or failed on it) and send the whole letter.
"""

from __future__ import annotations

import struct
from typing import Final

# ----------------------------------------------------------------- wal/ directory names
LOCK_FILE: Final = "LOCK"
CHECKPOINT_FILE: Final = "checkpoint"
LOG_ID_FILE: Final = "id"
LOG_ID_ADOPTED: Final = b"adopted"
"""The second line of ``wal/id`` of a log an agent before ids wrote."""
SEGMENT_SUFFIX: Final = ".seg"
QUARANTINE_DIR: Final = "quarantine"
QUARANTINE_REASON_SUFFIX: Final = ".json"
REBUILD_SUFFIX: Final = ".rebuild"
LEFTOVER_PATTERNS: Final = (".*.tmp", f"*{REBUILD_SUFFIX}")
"""Names of interrupted writes in ``wal/``, removed when the log is opened."""

# ----------------------------------------------------------------- segment header
SEGMENT_MAGIC: Final = b"DPWALSG1"
SEGMENT_HEADER: Final = struct.Struct(">8sQ")  # magic, base offset
SEGMENT_HEADER_SIZE: Final = SEGMENT_HEADER.size
_SEGMENT_NAME_DIGITS = 20
MAX_OFFSET: Final = (1 << 63) - 1
"""The highest WAL offset: far beyond any real log, and a segment name above it is refused."""

# ----------------------------------------------------------------- frame
FRAME_MAGIC: Final = b"\xd7WF1"
FRAME_PREFIX: Final = struct.Struct(">4sII")  # magic, body length, crc32c
FRAME_BODY_HEAD: Final = struct.Struct(">QiIQH")  # offset, partition, records, ms, topic length
PREFIX_SIZE: Final = FRAME_PREFIX.size
HEADER_SIZE: Final = FRAME_PREFIX.size + FRAME_BODY_HEAD.size
"""Bytes of a frame before its topic."""
MAX_TOPIC_BYTES: Final = 249 * 4  # Kafka topic names are at most 249 characters
MAX_BODY_BYTES: Final = 1 << 31

# ----------------------------------------------------------------- two-slot files
SLOT_SPACING: Final = 512  # one slot per disk sector
SLOT_FILE_SIZE: Final = 2 * SLOT_SPACING


def slot_structs(fields: int) -> tuple[struct.Struct, struct.Struct]:
    """(head, slot) of a two-slot file holding ``fields`` integers: magic, sequence, the
    integers; the slot adds the crc32c of the head."""
    head = ">8sQ" + "Q" * fields
    return struct.Struct(head), struct.Struct(head + "I")


# ----------------------------------------------------------------- checkpoint
CHECKPOINT_MAGIC: Final = b"DPWALCK2"
CHECKPOINT_SLOT_HEAD, CHECKPOINT_SLOT = slot_structs(1)  # magic, sequence, offset (+ crc32c)
CHECKPOINT_SLOT_SPACING: Final = SLOT_SPACING
CHECKPOINT_FILE_SIZE: Final = SLOT_FILE_SIZE

# ----------------------------------------------------------------- forwarder hint (state/)
HINT_MAGIC: Final = b"DPFWDHT1"
HINT_FIELDS: Final = 2  # sent_high, delivered_high


def segment_name(base_offset: int) -> str:
    return f"{base_offset:0{_SEGMENT_NAME_DIGITS}d}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    """The number a segment-shaped file name carries; None for any other name.

    The number may exceed ``MAX_OFFSET`` (``99999999999999999999.seg``): callers refuse those.
    """
    stem, dot, suffix = name.partition(".")
    if (
        dot
        and "." + suffix == SEGMENT_SUFFIX
        and len(stem) == _SEGMENT_NAME_DIGITS
        and stem.isdigit()
    ):
        return int(stem)
    return None


def encode_segment_header(base_offset: int) -> bytes:
    return SEGMENT_HEADER.pack(SEGMENT_MAGIC, base_offset)
