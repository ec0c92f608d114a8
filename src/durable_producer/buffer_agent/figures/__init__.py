"""The agent's figures: what it measures and publishes, never what it decides.

Below ``forward/`` and the agent's start-up (which feed them), beside ``wal/``; nothing here
imports the data path. One job per module:

- ``metrics.py``: ``AgentMetrics``, the Prometheus gauges, counters and histograms (own registry)
- ``metrics_server.py``: ``/metrics``, ``/healthz`` and ``/readyz`` on a background thread
- ``forward_rate.py``: the forward rate sustained under load and "cannot drain" (pure, measured)
- ``drain_metrics.py``: the gauges of ingest and forward rates, time to drain, "cannot drain"
"""
