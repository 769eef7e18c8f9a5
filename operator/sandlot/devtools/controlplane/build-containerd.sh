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

CONTAINERD2_VERSION="${CONTAINERD2_VERSION:-2.4.2}"
cache_root="${SANDLOT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sandlot}"
out="$cache_root/containerd/v${CONTAINERD2_VERSION}"
binaries=(containerd containerd-shim-runc-v2 ctr)

complete=1
for b in "${binaries[@]}"; do [[ -x "$out/bin/$b" ]] || complete=0; done
if ((complete)); then
  echo "$out/bin"
  exit 0
fi

command -v go >/dev/null || { echo "build-containerd: 'go' is not on PATH" >&2; exit 1; }
mkdir -p "$out/bin"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export GOFLAGS="${GOFLAGS:--buildvcs=false}" CGO_ENABLED=0

echo "build-containerd: building containerd v${CONTAINERD2_VERSION} into $out" >&2
cd "$work"
go mod init sandlot.local/containerd >/dev/null 2>&1
cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
GO
module="github.com/containerd/containerd/v2"
go get "${module}@v${CONTAINERD2_VERSION}" >/dev/null 2>&1 || go get "${module}@v${CONTAINERD2_VERSION}"
go mod tidy >/dev/null 2>&1 || go mod tidy
tags="no_btrfs no_devmapper no_zfs"
ldflags="-s -w -X ${module}/version.Version=v${CONTAINERD2_VERSION} -X ${module}/version.Revision=module"
for b in "${binaries[@]}"; do
  go build -trimpath -tags "$tags" -ldflags "$ldflags" -o "$work/$b" "${module}/cmd/$b"
done
for b in "${binaries[@]}"; do
  install -m 0755 "$work/$b" "$out/bin/$b.tmp" && mv "$out/bin/$b.tmp" "$out/bin/$b"
done
echo "$out/bin"
