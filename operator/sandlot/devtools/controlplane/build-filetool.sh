#!/usr/bin/env bash
# Builds sandlot-files (operator/filetool, the tool the agent mounts into every
# sandbox for `sandlot cp`) with this machine's Go toolchain: static, no module
# to download. Cached by a hash of its source, installed atomically.
#
#   build-filetool.sh            # prints the path of the binary
#
# SANDLOT_CACHE_DIR picks the cache root.
set -euo pipefail
build_name=build-filetool
source "$(dirname "${BASH_SOURCE[0]}")/gobuild.sh"

src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../filetool" && pwd)"
hash="$(cat "$src/go.mod" "$src/main.go" | sha256sum | cut -c1-16)"
out="$cache_root/filetool/$hash"
cached_or_continue "$out/sandlot-files" "$out/sandlot-files"

start_build "$out"
build_log "building sandlot-files into $out"
cp "$src/go.mod" "$src/main.go" "$work/"
(cd "$work" && GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$work/sandlot-files" .)
install_atomic "$work/sandlot-files" "$out/sandlot-files"
echo "$out/sandlot-files"
