"""The fault proxy lives in the package (the demo uses it too); tests import it here."""

from durable_producer.local.fault_proxy import FaultProxy, ProxyMode

__all__ = ["FaultProxy", "ProxyMode"]
