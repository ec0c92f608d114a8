"""The compiled parts (C, optional): the ingest's record scanner, the forwarder's frame scan,
frame numbering and batch merge, and the cache of freed object arenas.

Everything else is in pyproject.toml. Without a C compiler the build skips them: the agent then
validates records with aiokafka's compiled reader instead (slower, same result), decodes and
numbers WAL frames one at a time in Python, forwards client batches one by one instead of
merging small ones, and CPython unmaps every freed arena of small objects.
"""

from setuptools import Extension, setup

SHARED_HEADERS = "src/durable_producer/buffer_agent/kafka"
SOLE_BATCH_H = f"{SHARED_HEADERS}/sole_batch.h"
"""The one-batch check both the batch merge and the frame numbering compile in."""

setup(
    ext_modules=[
        Extension(
            "durable_producer.buffer_agent.kafka._record_scan",
            ["src/durable_producer/buffer_agent/kafka/_record_scan.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "durable_producer.buffer_agent.wal._frame_scan",
            ["src/durable_producer/buffer_agent/wal/_frame_scan.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "durable_producer.buffer_agent.kafka._batch_merge",
            ["src/durable_producer/buffer_agent/kafka/_batch_merge.c"],
            include_dirs=[SHARED_HEADERS],
            depends=[SOLE_BATCH_H],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "durable_producer.buffer_agent._arena_cache",
            ["src/durable_producer/buffer_agent/_arena_cache.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "durable_producer.buffer_agent.forward._number_frames",
            ["src/durable_producer/buffer_agent/forward/_number_frames.c"],
            include_dirs=[SHARED_HEADERS],
            depends=[SOLE_BATCH_H],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ]
)
