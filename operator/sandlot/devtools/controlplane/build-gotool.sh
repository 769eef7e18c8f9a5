#!/usr/bin/env bash
# Builds one of the static Go tools the agent mounts into every sandbox, with this
# machine's Go toolchain: no module to download. Cached by a hash of its source,
# installed atomically.
#
#   SANDLOT_GOTOOL=filetool SANDLOT_GOTOOL_BINARY=sandlot-files build-gotool.sh
#       # operator/filetool, for `sandlot cp`; prints the path of the binary
#   SANDLOT_GOTOOL=executor SANDLOT_GOTOOL_BINARY=sandlot-exec build-gotool.sh
#       # operator/executor, which runs a sandbox's commands at the cost of a fork
#
# SANDLOT_CACHE_DIR picks the cache root.
set -euo pipefail
tool="${SANDLOT_GOTOOL:?which tool under operator/ to build}"
binary="${SANDLOT_GOTOOL_BINARY:?the name of the binary to build}"
build_name="build-$tool"
source "$(dirname "${BASH_SOURCE[0]}")/gobuild.sh"

src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../$tool" && pwd)"
hash="$(cat "$src/go.mod" "$src/main.go" | sha256sum | cut -c1-16)"
out="$cache_root/$tool/$hash"
cached_or_continue "$out/$binary" "$out/$binary"

start_build "$out"
build_log "building $binary into $out"
cp "$src/go.mod" "$src/main.go" "$work/"
(cd "$work" && GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$work/$binary" .)
install_atomic "$work/$binary" "$out/$binary"
echo "$out/$binary"
