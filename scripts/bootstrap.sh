#!/usr/bin/env bash
# Sets up everything sandlot's commands need on a fresh machine, and nothing twice:
#   - OS packages (as root on Debian/Ubuntu): containerd, runc, crun (a second
#     runtime handler), busybox-static
#     (test images), containerd's API definitions (stubs), CNI plugins, openssl,
#     docker-registry and skopeo (a real registry on loopback for pull tests),
#     btrfs-progs (a small btrfs with quotas for the write-cap tests);
#   - a virtualenv in .venv with sandlot and its development tools, pinned with
#     hashes by requirements/dev.txt (`make lock`);
#   - Python stubs for containerd's gRPC API, generated from its .proto files;
#   - kube-apiserver, etcd and kubectl built from their Go modules (cached by version);
#   - containerd 2.x built from its Go module (cached by version): the containerd
#     tests run against it as well as against the OS package's 1.6.
#   - gVisor's runsc and containerd shim built from its Go module (cached by version):
#     the gvisor runtime handler of the tests' containerd 2.x.
#   - kubelet and kube-scheduler from the same module, and the local cluster's images
#     (pause, and sandlot from the Dockerfile's recipe with debootstrap), cached.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "bootstrap: $*" >&2; }

os_packages=(containerd runc crun busybox-static btrfs-progs golang-github-containerd-containerd-dev
             golang-github-gogo-protobuf-dev containernetworking-plugins iproute2 openssl
             docker-registry skopeo debootstrap gcc libc6-dev)
missing=()
if command -v dpkg-query >/dev/null; then
  for p in "${os_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
fi
if ((${#missing[@]})); then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    log "installing OS packages: ${missing[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    log "missing OS packages (${missing[*]}); install them as root, or tests that need them skip"
  fi
fi

python="${PYTHON:-python3}"
if [[ ! -x .venv/bin/python ]]; then
  log "creating .venv"
  "$python" -m venv .venv
fi
# Installed again whenever pyproject.toml or the lock changes.
lock=requirements/dev.txt
stamp=.venv/.sandlot-deps
want="$(cat pyproject.toml "$lock" | sha256sum | cut -d' ' -f1)"
if [[ ! -f $stamp || "$(cat "$stamp")" != "$want" ]]; then
  log "installing Python dependencies ($lock)"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q --require-hashes -r "$lock"
  .venv/bin/python -m pip install -q --no-deps -e .
  .venv/bin/python -m pip check >&2
  echo "$want" > "$stamp"
fi

log "containerd API stubs"
.venv/bin/python -m sandlot.devtools.gen_stubs >&2

log "control-plane binaries (kube-apiserver, etcd, kubectl; built once, then cached)"
bash operator/sandlot/devtools/controlplane/build-control-plane.sh >/dev/null
log "kube-controller-manager (garbage collector and namespace controller; built once, then cached)"
bash operator/sandlot/devtools/controlplane/build-controller-manager.sh >/dev/null
log "helm (built once, then cached)"; bash operator/sandlot/devtools/controlplane/build-helm.sh >/dev/null
log "containerd 2.x (the second containerd line the tests run on; built once, then cached)"
bash operator/sandlot/devtools/controlplane/build-containerd.sh >/dev/null
log "gVisor (runsc and its shim: the gvisor runtime handler; built once, then cached)"
bash operator/sandlot/devtools/controlplane/build-gvisor.sh >/dev/null
log "kubelet and kube-scheduler (the local cluster's nodes; built once, then cached)"
bash operator/sandlot/devtools/controlplane/build-node.sh >/dev/null
log "local cluster images (pause; sandlot from the Dockerfile's recipe; runtimes from the gVisor build; cached by their inputs)"
.venv/bin/python -m sandlot.devtools.cluster.images >&2
