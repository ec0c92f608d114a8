"""The operator's decisions: pure functions from observed objects to desired ones.

Nothing here calls the Kubernetes API or the network, and nothing imports kopf (an
import-linter contract in pyproject.toml keeps it so); ``act/`` carries the decisions out.
"""
