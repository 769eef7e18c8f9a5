#!/usr/bin/env bash
# Builds kubelet and kube-scheduler from the same k8s.io/kubernetes module and
# release as kube-apiserver (build-control-plane.sh), into the same cache
# directory, once: the local cluster (`sandlot dev cluster up`) schedules pods
# and runs them on kubelets, as a real cluster does.
#
#   build-node.sh                          # prints the directory holding the binaries
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-3.6.16}"
cache_root="${SANDLOT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sandlot}"
out="$cache_root/controlplane/k8s-v${KUBE_VERSION}-etcd-v${ETCD_VERSION}"

if [[ -x "$out/kubelet" && -x "$out/kube-scheduler" ]]; then
  echo "$out"
  exit 0
fi

command -v go >/dev/null || { echo "build-node: 'go' is not on PATH" >&2; exit 1; }
mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export GOFLAGS="${GOFLAGS:--buildvcs=false}" CGO_ENABLED=0
echo "build-node: building kubelet and kube-scheduler v${KUBE_VERSION} into $out" >&2

# The same module set-up as kube-apiserver's: staging modules at their published
# versions of the release (so the Go build cache of that build is reused).
cd "$work"
go mod init sandlot.local/node >/dev/null 2>&1
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
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
go mod tidy >/dev/null 2>&1 || go mod tidy
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v${KUBE_VERSION} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$KUBE_VERSION" | cut -d. -f2)"
for program in kube-scheduler kubelet; do
  go build -trimpath -ldflags "$ldflags" -o "$work/$program" "k8s.io/kubernetes/cmd/$program"
done

# Install atomically, so an interrupted build never leaves a half-filled cache.
for program in kube-scheduler kubelet; do
  install -m 0755 "$work/$program" "$out/$program.tmp"
  mv "$out/$program.tmp" "$out/$program"
done
echo "$out"
