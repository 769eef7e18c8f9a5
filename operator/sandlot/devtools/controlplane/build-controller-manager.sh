#!/usr/bin/env bash
# Builds kube-controller-manager from the same k8s.io/kubernetes module and release
# as kube-apiserver (build-control-plane.sh), into the same cache directory, once:
# the local control plane runs its garbage collector and namespace controller, so
# deleting an owner or a namespace ends what it owned, as on a cluster.
#
#   build-controller-manager.sh            # prints the path of the binary
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-3.6.16}"
cache_root="${SANDLOT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sandlot}"
out="$cache_root/controlplane/k8s-v${KUBE_VERSION}-etcd-v${ETCD_VERSION}"

if [[ -x "$out/kube-controller-manager" ]]; then
  echo "$out/kube-controller-manager"
  exit 0
fi

command -v go >/dev/null || { echo "build-controller-manager: 'go' is not on PATH" >&2; exit 1; }
mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export GOFLAGS="${GOFLAGS:--buildvcs=false}" CGO_ENABLED=0
echo "build-controller-manager: building kube-controller-manager v${KUBE_VERSION} into $out" >&2

# The same module set-up as kube-apiserver's: staging modules at their published
# versions of the release (so the Go build cache of that build is reused).
cd "$work"
go mod init sandlot.local/controllermanager >/dev/null 2>&1
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

import _ "k8s.io/kubernetes/cmd/kube-controller-manager"
GO
go mod tidy >/dev/null 2>&1 || go mod tidy
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v${KUBE_VERSION} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$KUBE_VERSION" | cut -d. -f2)"
go build -trimpath -ldflags "$ldflags" -o "$work/kcm" k8s.io/kubernetes/cmd/kube-controller-manager

install -m 0755 "$work/kcm" "$out/kube-controller-manager.tmp"
mv "$out/kube-controller-manager.tmp" "$out/kube-controller-manager"
echo "$out/kube-controller-manager"
