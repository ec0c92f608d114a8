"""Every length and count of a request checked against the bytes it has, before kio reads it.

kio's reader (Rust) reserves room for an array's declared count before it reads an element:
a Metadata request of 17 bytes declaring 2**32 topics made it ask for 34 GB, and the failed
allocation aborted the agent's process (no exception to catch). A client, hostile or broken,
could crash the agent at will. ``check_bounds`` walks a request as kio's reader will, by the
same schema, and refuses any count or length beyond the bytes left (an element of an array
takes at least one byte; a fixed-size one its size). It reads nothing into objects; kio then
decodes what it let through. Produce requests are parsed by ``parse_produce``, not kio.
"""

from __future__ import annotations

import dataclasses
import struct
from functools import cache
from typing import Any

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)

from durable_producer.buffer_agent.kafka.varint import read_uvarint

_FIXED = {
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
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
"""The sizes of kio's fixed-size primitive types."""
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


class OutOfBounds(ValueError):
    """A length or count the request's bytes cannot hold."""


def check_bounds(schema: type, data: bytes | memoryview, pos: int, *, header: bool = False) -> int:
    """Walk one ``schema`` entity at ``pos`` of ``data``; the position after it.
    ``OutOfBounds`` if a length or count exceeds what is left. ``header``: a request header
    (its client id is a legacy string whatever the version, as Kafka and kio read it)."""
    return _entity(memoryview(data), _plan(schema, header), pos)


FIXED, TEXT, LEGACY_TEXT, ENTITY = range(4)
Step = tuple[int, Any, bool, bool]
"""How to walk one field: (kind, its argument, an array, nullable). FIXED: the size; TEXT:
a string's or bytes' legacy length prefix (compact in a flexible schema); LEGACY_TEXT: the
same, legacy in any schema; ENTITY: the entity's plan."""
Plan = tuple[bool, tuple[Step, ...]]
"""A schema's walk: (flexible, its fields' steps in wire order)."""


@cache
def _plan(schema: type, header: bool = False) -> Plan:
    """The walk of ``schema``, worked out once from its fields (introspecting them each time
    cost ten times kio's own read)."""
    steps: list[Step] = []
    for field in dataclasses.fields(schema):
        if get_field_tag(field) is not None:
            continue  # the requests read here have none: test_request_bounds.py checks it
        kind = classify_field(field)
        array = isinstance(kind, (PrimitiveTupleField, EntityTupleField))
        nullable = is_optional(field) and not array
        if header and field.name == "client_id":
            steps.append((LEGACY_TEXT, _INT16, False, True))
        elif isinstance(kind, (EntityField, EntityTupleField)):
            steps.append((ENTITY, _plan(kind.type_), array, nullable))
        else:
            kafka_type = get_schema_field_type(field)
            size = _FIXED.get(kafka_type)
            if size is not None:
                steps.append((FIXED, size, array, nullable))
            else:
                steps.append((TEXT, _INT16 if kafka_type == "string" else _INT32, array, nullable))
    return bool(getattr(schema, "__flexible__", False)), tuple(steps)


def _entity(data: memoryview, plan: Plan, pos: int) -> int:
    flexible, steps = plan
    for kind, arg, array, nullable in steps:
        if not array:
            pos = _one(data, kind, arg, nullable, flexible, pos)
            continue
        if flexible:
            raw, pos = read_uvarint(data, pos)
            count = raw - 1  # 0: null
        else:
            count, pos = _int32(data, pos)
        for _ in range(_count(data, count, pos, arg if kind == FIXED else 1)):
            pos = _one(data, kind, arg, False, flexible, pos)
    if not flexible:
        return pos
    count, pos = read_uvarint(data, pos)  # tagged fields: skipped (kio refuses an unknown tag)
    for _ in range(_count(data, count, pos, 2)):  # a tag and a size: two bytes at least
        _, pos = read_uvarint(data, pos)
        size, pos = read_uvarint(data, pos)
        pos = _within(data, pos, size)
    return pos


def _one(data: memoryview, kind: int, arg: Any, nullable: bool, flexible: bool, pos: int) -> int:
    if kind == FIXED:
        return _within(data, pos, arg)
    if kind == ENTITY:
        if nullable:  # a nullable struct: a marker first, -1 for null
            _within(data, pos, 1)
            if data[pos] == 0xFF:
                return pos + 1
            pos += 1
        return _entity(data, arg, pos)
    if flexible and kind == TEXT:  # compact: uvarint length + 1 (0: null)
        raw, pos = read_uvarint(data, pos)
        return _within(data, pos, max(raw - 1, 0))
    _within(data, pos, arg.size)  # legacy: a signed length (-1: null)
    (length,) = arg.unpack_from(data, pos)
    return _within(data, pos + arg.size, max(length, 0))


def _int32(data: memoryview, pos: int) -> tuple[int, int]:
    _within(data, pos, 4)
    return _INT32.unpack_from(data, pos)[0], pos + 4


def _within(data: memoryview, pos: int, size: int) -> int:
    """The position ``size`` bytes on; ``OutOfBounds`` past the request's end."""
    if pos + size > len(data):
        raise OutOfBounds(f"{size} bytes at byte {pos} of a {len(data)}-byte request")
    return pos + size


def _count(data: memoryview, count: int, pos: int, smallest: int) -> int:
    """``count`` elements of at least ``smallest`` bytes fit from ``pos`` (negative: null,
    none)."""
    room = len(data) - pos
    if count * smallest > room:
        raise OutOfBounds(f"{count} elements declared at byte {pos}, {room} bytes left")
    return max(count, 0)
