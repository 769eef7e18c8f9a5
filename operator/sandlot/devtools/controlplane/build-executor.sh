#!/usr/bin/env bash
# Builds sandlot-exec (operator/executor, the executor the agent mounts into every
# sandbox to run its commands at the cost of a fork) with this machine's Go
# toolchain: static, no module to download. Cached by a hash of its source, installed atomically.
#
#   build-executor.sh           # prints the path of the binary
#
# SANDLOT_CACHE_DIR picks the cache root.
set -euo pipefail
build_name=build-executor
source "$(dirname "${BASH_SOURCE[0]}")/gobuild.sh"

src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../executor" && pwd)"
hash="$(cat "$src/go.mod" "$src/main.go" | sha256sum | cut -c1-16)"
out="$cache_root/executor/$hash"
cached_or_continue "$out/sandlot-exec" "$out/sandlot-exec"

start_build "$out"
build_log "building sandlot-exec into $out"
cp "$src/go.mod" "$src/main.go" "$work/"
(cd "$work" && GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$work/sandlot-exec" .)
install_atomic "$work/sandlot-exec" "$out/sandlot-exec"
echo "$out/sandlot-exec"
