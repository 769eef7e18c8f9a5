"""Tools for developing and trying sandlot on one machine, never run in a cluster.

The local control plane (etcd + kube-apiserver) and its build scripts, a private
containerd with fault injection, the OCI archive builder, the containerd stub
generator, the demo, and the generators of CRDs and reference docs. They start
processes, build binaries and write files into the repository; the operator and
the agent must run without any of it, so an import-linter contract forbids the
runtime layers (api, policy, adapters, controllers, agent) from importing this
package, and the CLI imports it only inside the commands that use it.

This module imports nothing: ``python -m sandlot.devtools.gen_stubs`` runs in a
build stage where only grpcio-tools is installed.
"""
