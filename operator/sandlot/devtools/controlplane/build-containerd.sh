#!/usr/bin/env bash
# Builds containerd 2.x (daemon, runc v2 shim and ctr) from the
# github.com/containerd/containerd/v2 module with this machine's Go toolchain, so the
# agent's containerd tests also run against the 2.x line (the OS package is 1.6).
# Static, without the btrfs, devmapper and zfs snapshotters (they need C headers and
# the agent uses overlayfs). runc comes from the OS package. Like the control plane,
# the result is cached by version outside the repository and installed atomically:
# a second run builds nothing, an interrupted one leaves no half-written binary.
#
#   build-containerd.sh            # prints the directory holding the binaries
#
# CONTAINERD2_VERSION picks the release; SANDLOT_CACHE_DIR the cache root.
set -euo pipefail
build_name=build-containerd
source "$(dirname "${BASH_SOURCE[0]}")/gobuild.sh"

CONTAINERD2_VERSION="${CONTAINERD2_VERSION:-2.4.2}"
out="$cache_root/containerd/v${CONTAINERD2_VERSION}"
binaries=(containerd containerd-shim-runc-v2 ctr)
cached_or_continue "$out/bin" "${binaries[@]/#/$out/bin/}"

start_build "$out/bin"
build_log "building containerd v${CONTAINERD2_VERSION} into $out"
module="github.com/containerd/containerd/v2"
go_module "$work" sandlot.local/containerd "${binaries[@]/#/${module}/cmd/}"
go_require "$module" "v${CONTAINERD2_VERSION}"
go_tidy
tags="no_btrfs no_devmapper no_zfs"
ldflags="-s -w -X ${module}/version.Version=v${CONTAINERD2_VERSION} -X ${module}/version.Revision=module"
for b in "${binaries[@]}"; do
  go build -trimpath -tags "$tags" -ldflags "$ldflags" -o "$work/$b" "${module}/cmd/$b"
done
for b in "${binaries[@]}"; do install_atomic "$work/$b" "$out/bin/$b"; done
echo "$out/bin"
