#!/usr/bin/env bash
# Builds the binaries of a real Kubernetes control plane for tests (envtest style):
# kube-apiserver and kubectl from k8s.io/kubernetes, etcd from go.etcd.io/etcd/server/v3,
# with this machine's Go toolchain. Results are cached by version outside the
# repository, so a second run builds nothing.
#
#   build-control-plane.sh                 # prints the directory holding the binaries
#
# KUBE_VERSION / ETCD_VERSION pick the releases; SANDLOT_CACHE_DIR the cache root.
set -euo pipefail
build_name=build-control-plane
source "$(dirname "${BASH_SOURCE[0]}")/gobuild.sh"

out="$(kube_cache_dir)"
cached_or_continue "$out" "$out/kube-apiserver" "$out/etcd" "$out/kubectl"

start_build "$out"
build_log "building kube-apiserver and kubectl v${KUBE_VERSION} into $out"
go_module "$work/kube" sandlot.local/controlplane \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl
require_kubernetes
go_tidy
ldflags="$(kube_ldflags) -X k8s.io/client-go/pkg/version.gitVersion=v${KUBE_VERSION}"
go build -trimpath -ldflags "$ldflags" -o "$work/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
go build -trimpath -ldflags "$ldflags" -o "$work/kubectl" k8s.io/kubernetes/cmd/kubectl

# etcd: the module root of go.etcd.io/etcd/server/v3 is the etcd program.
build_log "building etcd v${ETCD_VERSION} into $out"
go_module "$work/etcd" sandlot.local/etcd go.etcd.io/etcd/server/v3
go_require go.etcd.io/etcd/server/v3 "v${ETCD_VERSION}"
go_tidy
go build -trimpath -ldflags "-s -w" -o "$work/etcd-bin" go.etcd.io/etcd/server/v3

install_atomic "$work/etcd-bin" "$out/etcd"
install_atomic "$work/kubectl" "$out/kubectl"
install_atomic "$work/kube-apiserver" "$out/kube-apiserver"
echo "$out"
