from typing import Any

def scan_frames(
    data: bytes | memoryview,
    pos: int,
    max_frames: int,
    max_bytes: int,
    wanted: int,
    frame_type: type,
    /,
) -> tuple[list[Any], int, int, int]: ...
def scan_spans(
    data: bytes | memoryview, pos: int, last_offset: int, max_frames: int, keep_spans: bool, /
) -> tuple[bytes, bytes, int, int, int]: ...
def crc32c(data: bytes | memoryview, value: int = 0, software: bool = False, /) -> int: ...
