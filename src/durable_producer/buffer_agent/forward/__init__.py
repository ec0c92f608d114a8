"""Forwarding: the WAL's stored client batches, as they are, to Kafka (docs/architecture.md).

- ``forwarder``: the Forwarder (start/stop/drain/stats): its thread, reading the WAL,
  settling, checkpoints, dead letters.
- ``partition_queue``: one partition's batches: numbering, merging, in flight, answers.
- ``sender``: Produce requests per leader, the answers, resolution, metadata.
- ``failure_policy``: what each answer calls for.
- ``identity``: the producer id, epochs and numbering kept on the volume.
- ``progress``: the WAL checkpoint and the sent/delivered hint; ``ack_tracker``: the
  contiguous acknowledged watermark, read from the partition queues' heads.
- ``dead_letter``: the dead-letter store; ``resend``: re-sending dead letters.
- ``health``, ``publisher``: the forwarder's state and figures (its sustained rate is
  ``figures/forward_rate.py``'s).
- ``config``: the forwarder's settings.
"""
