"""Entry point of ``python -m durable_producer.spark_integration``."""

from durable_producer.spark_integration.cli import main

raise SystemExit(main())
