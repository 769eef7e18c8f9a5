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

KUBE_VERSION="${KUBE_VERSION:-1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-3.6.16}"
cache_root="${SANDLOT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sandlot}"
out="$cache_root/controlplane/k8s-v${KUBE_VERSION}-etcd-v${ETCD_VERSION}"

if [[ -x "$out/kube-apiserver" && -x "$out/etcd" && -x "$out/kubectl" ]]; then
  echo "$out"
  exit 0
fi

command -v go >/dev/null || { echo "build-control-plane: 'go' is not on PATH" >&2; exit 1; }
mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export GOFLAGS="${GOFLAGS:--buildvcs=false}" CGO_ENABLED=0

log() { echo "build-control-plane: $*" >&2; }

# kube-apiserver and kubectl. k8s.io/kubernetes refers to its staging modules
# (k8s.io/api, k8s.io/apiserver, ...) as v0.0.0 with local replaces; point each of
# them at its published version of the same release.
log "building kube-apiserver and kubectl v${KUBE_VERSION} into $out"
mkdir -p "$work/kube"
cd "$work/kube"
go mod init sandlot.local/controlplane >/dev/null 2>&1
go mod download -json "k8s.io/kubernetes@v${KUBE_VERSION}" > kube.json
kube_dir="$(python3 -c 'import json,sys; print(json.load(open("kube.json"))["Dir"])')"
staging="$(sed -n 's#^\s*\(k8s\.io/[a-z0-9-]*\) => \./staging/.*#\1#p' "$kube_dir/go.mod" | sort -u)"
staging_version="v0.${KUBE_VERSION#1.}"
{
  echo "require k8s.io/kubernetes v${KUBE_VERSION}"
  echo "replace ("
  for m in $staging; do echo "  $m => $m $staging_version"; done
  echo ")"
} >> go.mod
cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
go mod tidy >/dev/null 2>&1 || go mod tidy
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v${KUBE_VERSION} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$KUBE_VERSION" | cut -d. -f2) -X k8s.io/client-go/pkg/version.gitVersion=v${KUBE_VERSION}"
go build -trimpath -ldflags "$ldflags" -o "$work/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
go build -trimpath -ldflags "$ldflags" -o "$work/kubectl" k8s.io/kubernetes/cmd/kubectl

# etcd: the module root of go.etcd.io/etcd/server/v3 is the etcd program.
log "building etcd v${ETCD_VERSION} into $out"
mkdir -p "$work/etcd"
cd "$work/etcd"
go mod init sandlot.local/etcd >/dev/null 2>&1
cat > tools.go <<'GO'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GO
go get "go.etcd.io/etcd/server/v3@v${ETCD_VERSION}" >/dev/null 2>&1 || go get "go.etcd.io/etcd/server/v3@v${ETCD_VERSION}"
go mod tidy >/dev/null 2>&1 || go mod tidy
go build -trimpath -ldflags "-s -w" -o "$work/etcd-bin" go.etcd.io/etcd/server/v3

# Install atomically, so an interrupted build never leaves a half-filled cache.
install -m 0755 "$work/etcd-bin" "$out/etcd.tmp" && mv "$out/etcd.tmp" "$out/etcd"
install -m 0755 "$work/kubectl" "$out/kubectl.tmp" && mv "$out/kubectl.tmp" "$out/kubectl"
install -m 0755 "$work/kube-apiserver" "$out/kube-apiserver.tmp" && mv "$out/kube-apiserver.tmp" "$out/kube-apiserver"
echo "$out"
