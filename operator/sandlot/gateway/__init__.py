"""The stream gateway: sandboxes' logs and exec as an aggregated API, relayed to the
node agents over mutual TLS (``server`` for the why)."""
