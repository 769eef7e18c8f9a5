"""`sandlot dev down` after `sandlot demo --keep` leaves nothing of the demo
behind: no process naming its directory (or its containerd's), no sandbox network
namespace, no link it made on the host (the sandboxes' veths, the demo bridge,
the stream address). A second `down` finds nothing left."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandlot.adapters.cni import Netns
from sandlot.devtools.containerd import unavailable_reason as containerd_missing
from sandlot.devtools.demonet import CNI_BRIDGE, DemoNetwork
from sandlot.devtools.registry import unavailable_reason as registry_missing

pytestmark = pytest.mark.integration

DEMO_TIMEOUT = 900  # seconds: the whole story, on a loaded 2-core machine
DOWN_TIMEOUT = 300
GONE_TIMEOUT = 30


def sandlot(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "sandlot.cli.main", *args]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        pytest.fail(f"sandlot {' '.join(args)} did not finish within {timeout}s:\n{out[-3000:]}")


def processes_naming(*paths: str) -> dict[int, str]:
    """Every process (but this one) whose command line names one of ``paths``."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if any(path in argv for path in paths):
            found[int(entry)] = argv
    return found


def links_on(bridge: str) -> set[str]:
    proc = subprocess.run(
        ["ip", "-j", "link", "show", "master", bridge], capture_output=True, text=True, timeout=30
    )
    return {link["ifname"] for link in json.loads(proc.stdout or "[]")}


def demo_netns(workdir: Path) -> set[str]:
    """The namespaces of the sandboxes holding an address: the host-local plugin keeps
    one file per address (``<container id>\\r\\n<ifname>``) under the demo's directory."""
    records_dir = workdir / "cni" / "ipam"
    if not records_dir.is_dir():
        return set()
    return {
        Netns.name_for(r.read_bytes().split(b"\r\n")[0].decode())
        for r in records_dir.glob("*/*")
        if r.name != "lock" and not r.name.startswith("last_reserved_ip.")
    }


def host_veths(netns: set[str]) -> set[str]:
    """The host ends of the sandboxes' interfaces (their peers' indexes)."""
    peers = set()
    for name in netns:
        proc = subprocess.run(
            ["ip", "-j", "-n", name, "link", "show", "eth0"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        peers |= {link["link_index"] for link in json.loads(proc.stdout or "[]")}
    proc = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True, timeout=30)
    return {link["ifname"] for link in json.loads(proc.stdout) if link["ifindex"] in peers}


def link_exists(name: str) -> bool:
    return (
        subprocess.run(["ip", "link", "show", name], capture_output=True, timeout=30).returncode
        == 0
    )


def scrub(workdir: Path, paths: tuple[str, ...], netns: set[str], links: set[str]) -> None:
    """Remove what a failed run of this test left, so failures do not pile up on the
    host: the processes naming its directories, the sandboxes' processes and
    namespaces, the links. The bridge only when no port is left on it: a demo run by
    hand meanwhile shares it."""
    for pid in processes_naming(*paths):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for name in netns | demo_netns(workdir):
        pids = subprocess.run(
            ["ip", "netns", "pids", name], capture_output=True, text=True, timeout=30
        ).stdout.split()
        for held in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(held), signal.SIGKILL)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
    for name in links - {CNI_BRIDGE}:
        subprocess.run(["ip", "link", "del", name], capture_output=True, timeout=30)
    if not links_on(CNI_BRIDGE):
        subprocess.run(["ip", "link", "del", CNI_BRIDGE], capture_output=True, timeout=30)


# The README's main job, in the order it tells it: each a line the demo prints.
MILESTONES = (
    r"starting a local control plane",
    r"both nodes Ready|NAME\s+PHASE",
    r"creating a pool of 4 sandboxes",
    r"killing demo-1's agent \(SIGKILL\)",
    r"(\d+) sandboxes Dead [\d.]+s after the kill",
    r"restarting demo-1's agent",
    # The dead ones torn down: ctr's header, then no task.
    r"\$ ctr -n sandlot-demo-1 tasks ls\n(\(no tasks\)|TASK +PID +STATUS *)\n\n\[",
    r"claiming a sandbox of the pool",
    r"\$ python: Client\(.*\)\.claim\('web', name='mine'\)\n-> Sandbox\(demo/\S+, Running\), claim mine",
    r"\$ sandlot logs \S+ -n demo --tail 5\n(.|\n)*?\(exit 0\)",
    r"\$ sandlot exec \S+ -n demo -- sh -c 'hostname; cat /www/index.html'\n(.|\n)*?\(exit 0\)",
    r"exiting 3\n\(exit 3\)",  # the command's own exit code, through the API server
    r"-> run\(\['cat', '/www/index.html'\]\)\n.+",  # the SDK's exec
    r"-> pause\(\)\n-> Sandbox\(demo/\S+, Running\): frozen in place on demo-\d",
    r"-> resume\(\)\n-> Sandbox\(demo/\S+, Running\), its main process started at tick \d+ \(the same process",
    r"sandlot cache clear containerd --all",
    r"left running",
)


def assert_story(out: str) -> None:
    """Every milestone of the story, in order, in the demo's output."""
    at = 0
    for milestone in MILESTONES:
        found = re.compile(milestone).search(out, at)
        assert found, f"the demo never got to {milestone!r} after:\n{out[at : at + 2000]}"
        at = found.end()
    dead = re.search(MILESTONES[4], out)
    assert dead and int(dead.group(1)) >= 1, "no sandbox went Dead with its node"


def test_dev_down_leaves_nothing_of_a_kept_demo(tmp_path: Path) -> None:
    reason = containerd_missing() or registry_missing()
    if reason:
        pytest.skip(reason)
    if not DemoNetwork(tmp_path).bin_dirs or shutil.which("ip") is None:
        pytest.skip("the CNI plugins (containernetworking-plugins) or iproute2 are missing")
    workdir = tmp_path / "demo"
    paths: tuple[str, ...] = (str(workdir),)
    netns: set[str] = set()
    links: set[str] = set()
    try:
        demo = sandlot("demo", "--keep", "--dir", str(workdir), timeout=DEMO_TIMEOUT)
        assert demo.returncode == 0, f"the demo failed:\n{demo.stdout[-20000:]}{demo.stderr}"
        assert_story(demo.stdout)
        state = json.loads((workdir / "state.json").read_text())
        paths += (state["containerd"]["root"],)
        netns = demo_netns(workdir)
        veths = host_veths(netns)
        links = veths | {state["streamLink"]}
        # The demo is up: its programs, four sandboxes with their namespaces and veths.
        assert processes_naming(*paths), "nothing of the kept demo runs"
        assert len(netns) >= 4, f"the demo's sandboxes hold {sorted(netns)}"
        assert set(Netns(timeout=10).names()) >= netns
        assert len(veths) >= 4 and veths <= links_on(CNI_BRIDGE), f"veths {veths} not on the bridge"
        assert link_exists(state["streamLink"])

        down = sandlot("dev", "down", "--dir", str(workdir), timeout=DOWN_TIMEOUT)

        assert down.returncode == 0, f"dev down failed:\n{down.stdout}{down.stderr}"
        deadline = time.monotonic() + GONE_TIMEOUT
        while (left := processes_naming(*paths)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, f"still running {GONE_TIMEOUT}s after dev down: {left}"
        assert not netns & set(Netns(timeout=10).names()), f"namespaces remain of {sorted(netns)}"
        assert not demo_netns(workdir), "the sandboxes' addresses are still allocated"
        assert not {link for link in links if link_exists(link)}, "the demo's links remain"
        # Gone, unless a demo run by hand meanwhile has sandboxes on it.
        assert not link_exists(CNI_BRIDGE) or links_on(CNI_BRIDGE), f"{CNI_BRIDGE} remains"
        assert "registry" in down.stdout and "sandbox networks" in down.stdout, down.stdout

        again = sandlot("dev", "down", "--dir", str(workdir), timeout=DOWN_TIMEOUT)
        assert again.returncode == 0, f"a second dev down failed:\n{again.stdout}{again.stderr}"
        assert "nothing was running" in again.stdout, again.stdout
    finally:
        scrub(workdir, paths, netns, links)
