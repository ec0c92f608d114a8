"""The one compiled part: the ingress's record scanner (C, optional).

Everything else is in pyproject.toml. Without a C compiler the build skips the extension and
the agent validates records with aiokafka's compiled reader instead (slower, same result).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "durable_producer.buffer_agent.kafka._record_scan",
            ["src/durable_producer/buffer_agent/kafka/_record_scan.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
