"""Forwarding: WAL -> decoded records -> an idempotent Kafka producer -> the cluster.

- ``forwarder``: the Forwarder (start/stop/drain/stats) and its thread's loop.
- ``delivery``: producing one frame's records; settling frames from delivery reports
  (sparse and careful modes).
- ``failure_policy``: what each Kafka error calls for; ``failures`` carries it out.
- ``progress``: the WAL checkpoint and the sent/delivered hint (duplicates accounting).
- ``producer``: the confluent-kafka producers' settings, creation and disposal.
- ``ack_tracker``: the contiguous delivered watermark.
- ``dead_letter``: the dead-letter store; ``resend``: re-sending dead letters.
- ``config``: the forwarder's settings.
"""
