#!/usr/bin/env bash
# Builds kube-controller-manager from the same k8s.io/kubernetes module and release
# as kube-apiserver (build-control-plane.sh), into the same cache directory, once:
# the local control plane runs its garbage collector and namespace controller, so
# deleting an owner or a namespace ends what it owned, as on a cluster.
#
#   build-controller-manager.sh            # prints the path of the binary
set -euo pipefail
build_name=build-controller-manager
source "$(dirname "${BASH_SOURCE[0]}")/gobuild.sh"

out="$(kube_cache_dir)"
cached_or_continue "$out/kube-controller-manager" "$out/kube-controller-manager"

start_build "$out"
build_log "building kube-controller-manager v${KUBE_VERSION} into $out"
go_module "$work" sandlot.local/controllermanager k8s.io/kubernetes/cmd/kube-controller-manager
require_kubernetes
go_tidy
go build -trimpath -ldflags "$(kube_ldflags)" -o "$work/kcm" k8s.io/kubernetes/cmd/kube-controller-manager

install_atomic "$work/kcm" "$out/kube-controller-manager"
echo "$out/kube-controller-manager"
