"""The embedded default: a local Kafka-compatible broker, a fault proxy and agent processes.

Used by ``python -m durable_producer.demo`` (the README's main job), the tests and the
benchmarks, so all three start the same real processes the same way:

- ``process``: the shared base (``ManagedProcess``: start, wait until ready, stop, kill, log
  tail, with-block cleanup) and ``poll_until``, the one ready-wait;
- ``broker``: the tansu broker process, and a broker behind a fault proxy;
- ``agent_process``: ``durable-agent run`` as a child process, and its metrics;
- ``fault_proxy`` (+ ``produce_refusal``): the TCP proxy that cuts, hangs or refuses;
- ``mock_cluster`` (+ ``rdkafka_mock``, its ctypes binding): librdkafka's multi-broker mock
  cluster with injectable faults (leader moves, brokers down, slow, request errors);
- ``topics``: create a topic, read one back; ``ports``: loopback and free ports.
"""
