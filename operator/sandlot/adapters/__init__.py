"""Adapters: the only modules that talk to the outside world (the Kubernetes API,
containerd's gRPC API, local processes). Everything above them gets plain data."""
