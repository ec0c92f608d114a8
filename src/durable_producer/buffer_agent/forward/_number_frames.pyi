from typing import Any

def number_sole_batches(
    frames: list[Any],
    start: int,
    queues: dict[tuple[str, int], Any],
    plain_from: int,
    sequence_limit: int,
    /,
) -> tuple[int, int, int]: ...
def take_run(
    frames: Any, max_bytes: int, spare: int, /
) -> tuple[list[Any], list[bytes | memoryview], int, int]: ...
