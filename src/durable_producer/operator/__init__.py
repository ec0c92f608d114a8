"""The control plane: kopf handlers (thin) and pure reconcile/sizing logic."""
