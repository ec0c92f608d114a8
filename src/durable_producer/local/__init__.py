"""The embedded default: a local Kafka-compatible broker, a fault proxy and agent processes.

Used by ``python -m durable_producer.demo`` (the README's main job), the tests and the
benchmarks, so all three start the same real processes the same way.
"""
