# Sourced by the build-*.sh scripts beside it: what every one of them does the same
# way. A build is cached by version under the cache root (SANDLOT_CACHE_DIR, else
# $XDG_CACHE_HOME/sandlot, else ~/.cache/sandlot), so a second run builds nothing;
# it runs in a throw-away Go module, statically, and installs each binary
# atomically, so an interrupted build never leaves a half-written one.
#
# A script sets `build_name` (its name in messages) before sourcing this file.

cache_root="${SANDLOT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sandlot}"

# The Kubernetes and etcd releases the control plane's and the nodes' builds take
# (devtools/controlplane/__init__.py names the same defaults).
KUBE_VERSION="${KUBE_VERSION:-1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-3.6.16}"

# The directory the Kubernetes binaries share: one per Kubernetes and etcd release.
kube_cache_dir() {
  echo "$cache_root/controlplane/k8s-v${KUBE_VERSION}-etcd-v${ETCD_VERSION}"
}

# cached_or_continue ANSWER FILE...: when every FILE is an executable already, print
# ANSWER and end the script: the cache holds this build.
cached_or_continue() {
  local answer="$1" f
  shift
  for f in "$@"; do [[ -x "$f" ]] || return 0; done
  echo "$answer"
  exit 0
}

# start_build OUT: a fresh work directory in $work (removed on exit), OUT created,
# the Go toolchain required and set for static, reproducible builds.
start_build() {
  command -v go >/dev/null || { echo "$build_name: 'go' is not on PATH" >&2; exit 1; }
  mkdir -p "$1"
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  export GOFLAGS="${GOFLAGS:--buildvcs=false}" CGO_ENABLED=0
}

build_log() { echo "$build_name: $*" >&2; }

# go_module DIR NAME IMPORT...: a module NAME in DIR (made and entered) whose
# tools.go imports each IMPORT, so `go mod tidy` pins what the builds need.
go_module() {
  local dir="$1" name="$2" import
  shift 2
  mkdir -p "$dir"
  cd "$dir"
  go mod init "$name" >/dev/null 2>&1
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    for import in "$@"; do printf '\t_ "%s"\n' "$import"; done
    printf ')\n'
  } > tools.go
}

# go_require MODULE VERSION: add MODULE at VERSION (quietly, unless it fails).
go_require() {
  go get "$1@$2" >/dev/null 2>&1 || go get "$1@$2"
}

go_tidy() {
  go mod tidy >/dev/null 2>&1 || go mod tidy
}

# require_kubernetes: k8s.io/kubernetes at KUBE_VERSION in the current module. It
# refers to its staging modules (k8s.io/api, k8s.io/apiserver, ...) as v0.0.0 with
# local replaces; point each of them at its published version of the same release.
# Every Kubernetes build does the same, so the Go build cache of one serves the next.
require_kubernetes() {
  local kube_dir staging staging_version m
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
}

# The version a Kubernetes binary reports about itself.
kube_ldflags() {
  echo "-s -w -X k8s.io/component-base/version.gitVersion=v${KUBE_VERSION} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$KUBE_VERSION" | cut -d. -f2)"
}

# install_atomic SRC DEST: DEST appears whole or not at all.
install_atomic() {
  install -m 0755 "$1" "$2.tmp"
  mv "$2.tmp" "$2"
}
