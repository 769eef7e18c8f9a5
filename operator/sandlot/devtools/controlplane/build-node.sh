#!/usr/bin/env bash
# Builds kubelet and kube-scheduler from the same k8s.io/kubernetes module and
# release as kube-apiserver (build-control-plane.sh), into the same cache
# directory, once: the local cluster (`sandlot dev cluster up`) schedules pods
# and runs them on kubelets, as a real cluster does.
#
#   build-node.sh                          # prints the directory holding the binaries
set -euo pipefail
build_name=build-node
source "$(dirname "${BASH_SOURCE[0]}")/gobuild.sh"

out="$(kube_cache_dir)"
programs=(kube-scheduler kubelet)
cached_or_continue "$out" "${programs[@]/#/$out/}"

start_build "$out"
build_log "building kubelet and kube-scheduler v${KUBE_VERSION} into $out"
go_module "$work" sandlot.local/node "${programs[@]/#/k8s.io/kubernetes/cmd/}"
require_kubernetes
go_tidy
for program in "${programs[@]}"; do
  go build -trimpath -ldflags "$(kube_ldflags)" -o "$work/$program" "k8s.io/kubernetes/cmd/$program"
done
for program in "${programs[@]}"; do install_atomic "$work/$program" "$out/$program"; done
echo "$out"
