def check_records(
    buffer: bytes | bytearray | memoryview, start: int, end: int, count: int, /
) -> None:
    """Raise ValueError unless buffer[start:end] holds exactly ``count`` well-formed records
    (what aiokafka's compiled reader accepts)."""
