"""The control plane: handlers.py (every kopf handler) at the door; act/ carries out what
decide/ (pure) decides about model/ (the spec, its conditions and quantities)."""
