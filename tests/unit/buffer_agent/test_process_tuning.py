"""The process-wide settings the agent applies once it serves."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="the allocator settings are glibc's"
)

REFAULTS_AFTER_FREE = textwrap.dedent(
    """
    import resource, sys
    from durable_producer.buffer_agent.process_tuning import keep_freed_memory

    if sys.argv[1] == "keep":
        assert keep_freed_memory()

    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    buffers = [bytearray(1_000_000) for _ in range(40)]  # 40 request buffers of 1 MB
    del buffers
    before = faults()
    buffers = [bytearray(1_000_000) for _ in range(40)]  # the next 40
    print(faults() - before)
    """
)


def page_faults_of_reallocation(mode: str) -> int:
    result = subprocess.run(
        [sys.executable, "-c", REFAULTS_AFTER_FREE, mode],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return int(result.stdout)


def test_freed_request_buffers_are_reused_without_page_faults() -> None:
    # glibc's defaults hand the 40 MB back to the kernel and fault every page in again
    # (~10,000 faults); kept, the second round reuses the same pages.
    default = page_faults_of_reallocation("default")
    kept = page_faults_of_reallocation("keep")
    assert default > 5_000, f"expected glibc's defaults to refault, saw {default} faults"
    assert kept < default // 20, f"{kept} faults with freed memory kept, {default} without"
