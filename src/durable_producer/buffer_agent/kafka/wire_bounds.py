"""Every length and count of a request or an answer checked against its bytes, before kio reads it.

kio's reader (Rust) reserves room for an array's declared count before it reads an element:
a Metadata request of 17 bytes declaring 2**32 topics made it ask for 34 GB, and the failed
allocation aborted the agent's process (no exception to catch). A client, hostile or broken,
could crash the agent at will; so could a broker's answer (a Produce answer of 6 bytes), or
anything that answers on a broker's port. ``check_bounds`` walks a request or an answer as
kio's reader will, by the same schema, and refuses any count or length beyond the bytes left
(an element of an array takes at least one byte; a fixed-size one its size). The tagged fields
a schema knows (Produce answers v10+) are walked within their declared size, which they must
fill. It reads nothing into objects; kio then decodes what it let through. Produce requests
are parsed by ``parse_produce``, not kio.

What Kafka's readers take and kio refuses is made readable (``Edits``, applied by ``edited``:
the bytes are copied only then):

- a tagged field the schema does not know is skipped by Kafka's readers: that is how a broker
  adds a field to an answer, or a client to a request, without a new version. kio refused it
  (KeyError). It is dropped, as is a known one holding an unknown one (the agent reads no
  tagged field of an answer: kio gives the field's default);
- an error code kio does not know (a newer broker's) is read by Kafka's clients as
  UNKNOWN_SERVER_ERROR; kio refused the whole answer (ValueError). It is made -1, that code.
"""

from __future__ import annotations

import dataclasses
import struct
from functools import cache
from typing import Any

from kio.schema.errors import ErrorCode
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)

from durable_producer.buffer_agent.kafka.varint import encode_uvarint, read_uvarint

_FIXED = {
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "uuid": 16,
}
"""The sizes of kio's fixed-size primitive types (``error_code`` is walked on its own)."""
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
KNOWN_ERROR_CODES = frozenset(code.value for code in ErrorCode)
"""The error codes kio knows; Kafka's clients read any other as UNKNOWN_SERVER_ERROR (-1)."""
_UNKNOWN_SERVER_ERROR = _INT16.pack(-1)


class OutOfBounds(ValueError):
    """A length or count the bytes of a request or answer cannot hold."""


Edits = list[tuple[int, int, bytes]]
"""What to change for kio, in the order of the bytes: (start, end, what replaces them)."""


def check_bounds(
    schema: type,
    data: bytes | memoryview,
    pos: int,
    *,
    header: bool = False,
    edits: Edits | None = None,
) -> int:
    """Walk one ``schema`` entity (a request's or an answer's) at ``pos`` of ``data``; the
    position after it. ``OutOfBounds`` if a length or count exceeds what is left. ``header``:
    a request header (its client id is a legacy string whatever the version, as Kafka and kio
    read it). ``edits``: what kio would refuse and Kafka reads is added to it (None: left)."""
    view = memoryview(data)
    try:
        return _within(view, _entity(view, _plan(schema, header), pos, edits), 0)
    except (IndexError, struct.error):  # read past the end (fixed fields are added up)
        raise OutOfBounds(f"a {len(view)}-byte entity ends in the middle of a field") from None


def edited(data: bytes | memoryview, edits: Edits) -> bytes:
    """``data`` with ``edits`` made."""
    parts: list[bytes | memoryview] = []
    view = memoryview(data)
    done = 0
    for start, end, replacement in edits:
        parts += (view[done:start], replacement)
        done = end
    parts.append(view[done:])
    return b"".join(parts)


FIXED, TEXT, LEGACY_TEXT, ENTITY, ERROR_CODE = range(5)
Step = tuple[int, Any, bool, bool]
"""How to walk one field: (kind, its argument, an array, nullable). FIXED: the size; TEXT:
a string's or bytes' legacy length prefix (compact in a flexible schema); LEGACY_TEXT: the
same, legacy in any schema; ENTITY: the entity's plan; ERROR_CODE: 2 (an array of them is
walked as FIXED: none is read)."""
Plan = tuple[bool, tuple[Step, ...], dict[int, Step]]
"""A schema's walk: (flexible, its fields' steps in wire order, the steps of the tagged fields
it knows by their tags)."""


@cache
def _plan(schema: type, header: bool = False) -> Plan:
    """The walk of ``schema``, worked out once from its fields (introspecting them each time
    cost ten times kio's own read)."""
    steps: list[Step] = []
    tagged: dict[int, Step] = {}
    for field in dataclasses.fields(schema):
        tag = get_field_tag(field)
        kind = classify_field(field)
        array = isinstance(kind, (PrimitiveTupleField, EntityTupleField))
        # A tagged field is present or not: no null marker (as kio writes and reads it).
        nullable = is_optional(field) and not array and tag is None
        if header and field.name == "client_id":
            step: Step = (LEGACY_TEXT, _INT16, False, True)
        elif isinstance(kind, (EntityField, EntityTupleField)):
            step = (ENTITY, _plan(kind.type_), array, nullable)
        else:
            kafka_type = get_schema_field_type(field)
            size = _FIXED.get(kafka_type)
            if kafka_type == "error_code":
                step = (FIXED if array else ERROR_CODE, 2, array, nullable)
            elif size is not None:
                step = (FIXED, size, array, nullable)
            else:
                step = (TEXT, _INT16 if kafka_type == "string" else _INT32, array, nullable)
        if tag is not None:
            tagged[tag] = step
        elif steps and step[0] == FIXED == steps[-1][0] and not step[2] and not steps[-1][2]:
            steps[-1] = (FIXED, steps[-1][1] + step[1], False, False)  # one step for a run
        else:
            steps.append(step)
    return bool(getattr(schema, "__flexible__", False)), tuple(steps), tagged


def _entity(data: memoryview, plan: Plan, pos: int, edits: Edits | None) -> int:
    """The position after the entity; it may be past the end (fixed-size fields are only
    added up: ``check_bounds`` checks the end, and any read past it is refused)."""
    flexible, steps, tagged = plan
    for kind, arg, array, nullable in steps:
        if kind == FIXED and not array:
            pos += arg
        elif kind == ERROR_CODE:
            pos = _error_code(data, pos, edits)
        else:
            pos = _field(data, kind, arg, array, nullable, flexible, pos, edits)
    if not flexible:
        return pos
    count = data[pos]  # most often none: one byte
    if count == 0:
        return pos + 1
    return _tagged_fields(data, tagged, pos, edits)


def _tagged_fields(
    data: memoryview, tagged: dict[int, Step], pos: int, edits: Edits | None
) -> int:
    """Walk an entity's tagged fields at ``pos``; the unknown ones (and a known one holding
    one) are dropped, their count lowered, in ``edits``."""
    count_start = pos
    count, pos = read_uvarint(data, pos)
    count_end = pos
    mine: Edits = []
    dropped = 0
    for _ in range(_count(data, count, pos, 2)):  # a tag and a size: two bytes at least
        start = pos
        tag, pos = read_uvarint(data, pos)
        size, pos = read_uvarint(data, pos)
        end = _within(data, pos, size)
        step = tagged.get(tag)
        inner: Edits = []
        # A known one must fill its size exactly: kio reads on from where its value ends, not
        # from its declared end, and would take what follows the value for the next tag.
        if step is not None and _field(data[:end], *step, True, pos, inner) != end:
            raise OutOfBounds(f"tagged field {tag} at byte {start}: not {size} bytes long")
        if step is not None and all(b - a == len(new) for a, b, new in inner):
            mine += inner  # error codes at most: its size stays
        else:
            dropped += 1
            if mine and mine[-1][1] == start and not mine[-1][2]:
                mine[-1] = (mine[-1][0], end, b"")  # one span for a run of them
            else:
                mine.append((start, end, b""))
        pos = end
    if edits is not None and mine:
        if dropped:
            edits.append((count_start, count_end, encode_uvarint(count - dropped)))
        edits += mine
    return pos


def _field(
    data: memoryview,
    kind: int,
    arg: Any,
    array: bool,
    nullable: bool,
    flexible: bool,
    pos: int,
    edits: Edits | None,
) -> int:
    if array:
        if flexible:
            count = data[pos] - 1  # 0: null
            if count < 0x7F:  # one byte
                pos += 1
            else:
                raw, pos = read_uvarint(data, pos)
                count = raw - 1
        else:
            _within(data, pos, 4)
            (count,) = _INT32.unpack_from(data, pos)
            pos += 4
        if count <= 0:  # empty or null: most arrays of an answer (its record errors)
            return pos
        if kind == FIXED:
            size: int = arg
            return pos + _count(data, count, pos, size) * size
        if kind == ENTITY:
            for _ in range(_count(data, count, pos, 1)):
                pos = _entity(data, arg, pos, edits)
            return pos
        for _ in range(_count(data, count, pos, 1)):
            pos = _field(data, kind, arg, False, False, flexible, pos, edits)
        return pos
    if kind == FIXED:
        fixed: int = arg
        return pos + fixed
    if kind == ENTITY:
        if nullable:  # a nullable struct: a marker first, -1 for null
            _within(data, pos, 1)
            if data[pos] == 0xFF:
                return pos + 1
            pos += 1
        return _entity(data, arg, pos, edits)
    if kind == ERROR_CODE:  # a tagged one
        return _error_code(data, pos, edits)
    if flexible and kind == TEXT:  # compact: uvarint length + 1 (0: null)
        raw = data[pos]
        if raw < 0x80:  # one byte
            pos += 1 + (raw - 1 if raw else 0)
            if pos > len(data):
                raise OutOfBounds(f"{raw - 1} bytes at byte {pos - raw} of {len(data)}")
            return pos
        raw, pos = read_uvarint(data, pos)  # 0 may take more bytes
        return _within(data, pos, max(raw - 1, 0))
    _within(data, pos, arg.size)  # legacy: a signed length (-1: null)
    (length,) = arg.unpack_from(data, pos)
    return _within(data, pos + arg.size, max(length, 0))


def _error_code(data: memoryview, pos: int, edits: Edits | None) -> int:
    """The position after the error code at ``pos``; one kio does not know is made -1."""
    if _INT16.unpack_from(data, pos)[0] not in KNOWN_ERROR_CODES and edits is not None:
        edits.append((pos, pos + 2, _UNKNOWN_SERVER_ERROR))
    return pos + 2


def _within(data: memoryview, pos: int, size: int) -> int:
    """The position ``size`` bytes on; ``OutOfBounds`` past the end."""
    if pos + size > len(data):
        raise OutOfBounds(f"{size} bytes at byte {pos} of {len(data)}")
    return pos + size


def _count(data: memoryview, count: int, pos: int, smallest: int) -> int:
    """``count`` elements of at least ``smallest`` bytes fit from ``pos`` (negative: null,
    none)."""
    room = len(data) - pos
    if count * smallest > room:
        raise OutOfBounds(f"{count} elements declared at byte {pos} of {len(data)}")
    return max(count, 0)
