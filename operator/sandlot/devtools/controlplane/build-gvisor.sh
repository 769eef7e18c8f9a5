#!/usr/bin/env bash
# Builds gVisor's runsc and its containerd shim (containerd-shim-runsc-v1) from the
# gvisor.dev/gvisor module: the runtime handler `gvisor` of the tests' containerd
# 2.x (the shim speaks the shim protocol of 2.x; 1.6 cannot start it).
# The module's tagged versions carry Bazel-only sources; its `go` branch is the Go
# build, which the Go proxy serves as the pseudo-version `@latest` resolves to.
#
# Static (CGO_ENABLED=0, as every build here): runsc re-executes /proc/self/exe
# inside its sandbox's empty root, where a dynamically linked runsc finds no ELF
# interpreter and its sandbox dies with "cannot read client sync file".
#
# One change to a dependency, made in a vendored copy: the shim lowers its own OOM
# score to -999, which needs CAP_SYS_RESOURCE; containerd's SetOOMScore forgives
# the refusal only inside a user namespace, so on a host whose root lacks that
# capability (this kind of machine; see NOTES) every start failed with "failed to
# set OOM Score on shim: permission denied". The patch forgives it there too: the
# shim then keeps containerd's score, as a shim in a user namespace does.
# Cached by version like the other Go-built binaries.
#
#   build-gvisor.sh            # prints the directory holding the binaries
#
# GVISOR_VERSION picks the pseudo-version; SANDLOT_CACHE_DIR the cache root.
set -euo pipefail
build_name=build-gvisor
source "$(dirname "${BASH_SOURCE[0]}")/gobuild.sh"

GVISOR_VERSION="${GVISOR_VERSION:-v0.0.0-20260905035102-160fafc42237}"
out="$cache_root/gvisor/${GVISOR_VERSION}"
binaries=(runsc containerd-shim-runsc-v1)
cached_or_continue "$out/bin" "${binaries[@]/#/$out/bin/}"

start_build "$out/bin"
build_log "building gVisor ${GVISOR_VERSION} (runsc and its shim) into $out"
module="gvisor.dev/gvisor"
go_module "$work" sandlot.local/gvisor "${module}/runsc" "${module}/shim"
go_require "$module" "${GVISOR_VERSION}"
go_tidy
go mod vendor
oom="vendor/github.com/containerd/containerd/v2/pkg/sys/oom_linux.go"
forgiven='if os.IsPermission(err) \&\& (!runningPrivileged() || userns.RunningInUserNS()) {'
grep -q 'if os.IsPermission(err) && (!runningPrivileged() || userns.RunningInUserNS()) {' "$oom" || {
  build_log "$oom no longer has the line this build patches: look again"
  exit 1
}
sed -i "s/${forgiven}/if os.IsPermission(err) \&\& (!runningPrivileged() || userns.RunningInUserNS() || !mayLowerOOMScore()) {/" "$oom"
cat >> "$oom" <<'GO'

// mayLowerOOMScore: whether this process has CAP_SYS_RESOURCE, which lowering an
// OOM score needs (a root without it is refused, as inside a user namespace).
func mayLowerOOMScore() bool {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return true
	}
	for _, line := range strings.Split(string(data), "\n") {
		if value, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(value), 16, 64)
			return err != nil || caps&(1<<24) != 0
		}
	}
	return true
}
GO
grep -q '"strings"' "$oom" || sed -i 's/^\t"strconv"$/\t"strconv"\n\t"strings"/' "$oom"
go build -mod=vendor -trimpath -ldflags "-s -w" -o "$work/runsc" "${module}/runsc"
go build -mod=vendor -trimpath -ldflags "-s -w" -o "$work/containerd-shim-runsc-v1" "${module}/shim"
for b in "${binaries[@]}"; do install_atomic "$work/$b" "$out/bin/$b"; done
echo "$out/bin"
