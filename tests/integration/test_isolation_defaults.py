"""containerd's CRI defaults, claimed against containerd + runc and the kernel.

- seccomp is an allow-list: what containerd's RuntimeDefault refuses
  (``personality(ADDR_NO_RANDOMIZE)``, ``unshare(CLONE_NEWUSER)``, ``keyctl``,
  ``socket(AF_ALG | AF_VSOCK)``) fails with EPERM inside a sandbox, probed by a
  tiny static C binary built with gcc into the test image, while busybox's shell
  and its HTTP server still run and answer;
- every path containerd masks is masked (``/sys/devices/virtual/powercap`` too);
- an image's named ``USER`` resolves through the image's own /etc/passwd and
  /etc/group (read by the agent's containerd client from the image's layers).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from sandlot.policy.ocispec import MASKED_PATHS
from tests.support.containerd_fixtures import ImageFactory, ScriptRuns

pytestmark = [pytest.mark.integration, pytest.mark.containerd]

PROBE_SOURCE = Path(__file__).resolve().parents[1] / "support" / "probes" / "sysprobe.c"
PROBE_IMAGE = "docker.io/sandlot/sysprobe:test"
USER_IMAGE = "docker.io/sandlot/named-user:test"
EPERM = 1

PASSWD = b"root:x:0:0:root:/root:/bin/sh\napp:x:1234:2345:app:/tmp:/bin/sh\n"
GROUP = b"root:x:0:\napp:x:2345:\nextra:x:3456:app\n"


@pytest.fixture(scope="module")
def probe_binary(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed: cannot build the syscall probe")
    out = tmp_path_factory.mktemp("probe") / "sysprobe"
    proc = subprocess.run(
        [gcc, "-static", "-O2", "-o", str(out), str(PROBE_SOURCE)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"gcc failed (is libc6-dev installed?): {proc.stderr}"
    return out.read_bytes()


@pytest.fixture(scope="module")
def images(image_factory: ImageFactory, probe_binary: bytes) -> dict[str, str]:
    return {
        "probe": image_factory(PROBE_IMAGE, executable_files={"/bin/sysprobe": probe_binary}),
        "user": image_factory(
            USER_IMAGE,
            user="app",
            extra_files={"/etc/passwd": PASSWD, "/etc/group": GROUP},
        ),
    }


Run = Callable[..., tuple[int, str]]


@pytest.fixture
def run(script_runs: ScriptRuns) -> Run:
    """``run(image, script, **spec) -> (exit code, output)``: the agent's own
    ``build_oci_spec`` over the image config the agent's containerd client reads."""
    return script_runs.run


def _probes(output: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in output.splitlines() if " " in line)


def test_syscalls_runtime_default_refuses_fail_with_eperm(images: dict[str, str], run: Run) -> None:
    code, out = run(
        images["probe"],
        "sysprobe personality-no-aslr unshare-user keyctl socket-alg socket-vsock",
    )
    assert code == 0, out
    results = _probes(out)
    for name in ("personality-no-aslr", "unshare-user", "keyctl", "socket-alg", "socket-vsock"):
        assert results.get(name) == f"errno={EPERM}", f"{name}: {out}"


def test_ordinary_syscalls_pass_the_filter(images: dict[str, str], run: Run) -> None:
    code, out = run(images["probe"], "sysprobe personality-query socket-inet getpid")
    assert code == 0, out
    assert _probes(out) == {"personality-query": "ok", "socket-inet": "ok", "getpid": "ok"}, out


def test_busybox_shell_and_http_server_run_under_the_filter(
    images: dict[str, str], run: Run
) -> None:
    script = (
        "mkdir -p /tmp/www && echo hello-from-httpd > /tmp/www/index.html"
        " && busybox httpd -p 127.0.0.1:8080 -h /tmp/www"
        " && for i in $(busybox seq 1 50); do"
        " busybox wget -q -O - http://127.0.0.1:8080/ 2>/dev/null && break; busybox usleep 100000;"
        " done"
    )
    code, out = run(images["probe"], script)
    assert code == 0 and "hello-from-httpd" in out, out


def test_every_path_containerd_masks_is_masked(images: dict[str, str], run: Run) -> None:
    # A masked file reads empty (a /dev/null bind); a masked directory lists empty
    # (a read-only tmpfs). Paths this kernel lacks are skipped by runc.
    present = [p for p in MASKED_PATHS if Path(p).exists()]
    assert "/sys/devices/virtual/powercap" in MASKED_PATHS
    script = " ".join(
        f'if [ -d {p} ]; then echo "{p} $(ls -A {p} | busybox wc -l)";'
        f' else echo "{p} $(busybox wc -c < {p})"; fi;'
        for p in present
    )
    code, out = run(images["probe"], script)
    assert code == 0, out
    sizes = _probes(out)
    assert sizes == dict.fromkeys(present, "0"), f"unmasked among {present}:\n{out}"


def test_named_image_user_runs_as_its_passwd_entry(images: dict[str, str], run: Run) -> None:
    code, out = run(images["user"], "id -u; id -g; id -G")
    assert code == 0, out
    uid, gid, groups = out.splitlines()[:3]
    assert (uid, gid) == ("1234", "2345"), out
    assert set(groups.split()) == {"2345", "3456"}, out


def test_run_as_non_root_accepts_a_named_non_root_image_user(
    images: dict[str, str], run: Run
) -> None:
    code, out = run(images["user"], "id -u", securityContext={"runAsNonRoot": True})
    assert code == 0 and out.split()[0] == "1234", out
