"""sandlot: sandboxes on Kubernetes that survive the fleet's failures."""

__version__ = "0.1.0"
