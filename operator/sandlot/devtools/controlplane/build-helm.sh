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
build_name=build-helm
source "$(dirname "${BASH_SOURCE[0]}")/gobuild.sh"

HELM_VERSION="${HELM_VERSION:-3.22.0}"
out="$cache_root/helm/v${HELM_VERSION}"
cached_or_continue "$out/helm" "$out/helm"

start_build "$out"
build_log "building helm v${HELM_VERSION} into $out"
go_module "$work" sandlot.local/helm helm.sh/helm/v3/cmd/helm
go_require helm.sh/helm/v3 "v${HELM_VERSION}"
go_tidy
# helm reports its version from these variables; without them `helm version` says v3.x-dev.
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=v${HELM_VERSION} -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
go build -trimpath -ldflags "$ldflags" -o "$work/helm" helm.sh/helm/v3/cmd/helm

install_atomic "$work/helm" "$out/helm"
echo "$out/helm"
