"""durable-producer: producer-side durable buffering for Kafka on Kubernetes."""

__version__ = "0.1.0"
