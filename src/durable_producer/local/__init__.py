"""The embedded default: local Apache Kafka brokers, a fault proxy and agent processes.

Used by ``python -m durable_producer.demo`` (the README's main job), the tests and the
benchmarks, so all three start the same real processes the same way:

- ``process``: the shared base (``ManagedProcess``: start, wait until ready, stop, kill, log
  tail, with-block cleanup) and ``poll_until``, the one ready-wait;
- ``kafka_node``: one Apache Kafka node (KRaft, combined mode) as a child process, and where
  its jars and ``java`` are found;
- ``broker``: the single-node broker of the demo and most tests, and one behind a fault proxy;
- ``kafka_cluster``: three nodes (RF 3, ``min.insync.replicas=2``) and their faults;
- ``agent_process``: ``durable-agent run`` as a child process, and its metrics;
- ``fault_proxy``: the TCP proxy that cuts or hangs the path to a broker;
- ``mock_cluster`` (+ ``rdkafka_mock``, its ctypes binding): librdkafka's multi-broker mock
  cluster with injectable faults (leader moves, brokers down, slow, request errors);
- ``topics``: create a topic, read one back; ``ports``: loopback and free ports.
"""
