#!/usr/bin/env bash
# Builds helm (helm.sh/helm/v3/cmd/helm) with this machine's Go toolchain, for the
# chart tests and the kind suite. Like build-control-plane.sh, the result is cached
# by version outside the repository and installed atomically, so a second run
# builds nothing and an interrupted one leaves no half-written binary.
#
#   build-helm.sh            # prints the path of the helm binary
#
# HELM_VERSION picks the release; SANDLOT_CACHE_DIR the cache root.
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-3.22.0}"
cache_root="${SANDLOT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sandlot}"
out="$cache_root/helm/v${HELM_VERSION}"

if [[ -x "$out/helm" ]]; then
  echo "$out/helm"
  exit 0
fi

command -v go >/dev/null || { echo "build-helm: 'go' is not on PATH" >&2; exit 1; }
mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export GOFLAGS="${GOFLAGS:--buildvcs=false}" CGO_ENABLED=0

echo "build-helm: building helm v${HELM_VERSION} into $out" >&2
cd "$work"
go mod init sandlot.local/helm >/dev/null 2>&1
cat > tools.go <<'GO'
//go:build tools

package tools

import _ "helm.sh/helm/v3/cmd/helm"
GO
go get "helm.sh/helm/v3@v${HELM_VERSION}" >/dev/null 2>&1 || go get "helm.sh/helm/v3@v${HELM_VERSION}"
go mod tidy >/dev/null 2>&1 || go mod tidy
# helm reports its version from these variables; without them `helm version` says v3.x-dev.
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=v${HELM_VERSION} -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
go build -trimpath -ldflags "$ldflags" -o "$work/helm" helm.sh/helm/v3/cmd/helm

install -m 0755 "$work/helm" "$out/helm.tmp" && mv "$out/helm.tmp" "$out/helm"
echo "$out/helm"
