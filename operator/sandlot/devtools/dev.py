"""``sandlot dev up|down``: a local control plane (etcd, kube-apiserver and
kube-controller-manager's garbage collector and namespace controller) with the
CRDs applied, in the background, for trying sandlot on one machine.

``down`` stops what ``up``, ``sandlot demo --keep`` and ``sandlot dev cluster up``
left under a directory from what they recorded there, never by process name: a
pid is signalled only while its start time is the recorded one, and sandbox
networks are found from the IPAM plugin's records, which outlive containerd. So it
finishes the job after a crash, its own or the programs'."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from sandlot.adapters.kube import apply_crds, load_api_client
from sandlot.api.crdgen import KINDS, crd_for
from sandlot.devtools.cluster import LocalCluster
from sandlot.devtools.containerd import PrivateContainerd
from sandlot.devtools.controlplane import ETCD_DATA, ControlPlane, kubectl_path
from sandlot.devtools.demonet import CNI_BRIDGE, DemoNetwork

CONTROL_PLANE = ("kube-controller-manager", "kube-apiserver", "etcd")  # stopped in this order


def start_local(workdir: Path) -> ControlPlane:
    """Start a detached control plane under ``workdir`` and apply the CRDs."""
    workdir = workdir.resolve()
    if (workdir / "state.json").exists():
        stop_left_over(workdir)
    plane = ControlPlane(workdir=workdir, controller_manager=True)
    plane.start(detach=True)
    write_state(workdir, plane.state())
    api = load_api_client(str(plane.kubeconfig))
    try:
        apply_crds(api, [crd_for(k) for k in KINDS])
    finally:
        api.close()
    return plane


def up(directory: str) -> int:
    """Start the control plane under ``directory`` and say how to use it."""
    workdir = Path(directory)
    print(
        f"starting etcd, kube-apiserver and kube-controller-manager under {workdir.resolve()} ...",
        flush=True,
    )
    plane = start_local(workdir)
    kubectl = kubectl_path()
    print(f"control plane up at {plane.url}; CRDs applied.")
    print("next:")
    print(f"  export KUBECONFIG={plane.kubeconfig}")
    print(f"  {kubectl} get sandboxes -A")
    print(f"  {kubectl} api-resources --categories=sandlot")
    print(f"stop it with: sandlot dev down --dir {directory}")
    return 0


def write_state(workdir: Path, state: dict[str, Any]) -> None:
    """Record what runs under ``workdir`` (``state.json``), with each process's start
    time: ``down`` signals a recorded pid only while it is still that process."""
    state["started"] = {name: _start_time(pid) for name, pid in state.get("pids", {}).items()}
    (workdir / "state.json").write_text(json.dumps(state))


def stop_left_over(workdir: Path) -> list[str]:
    """Stop what ``up``, ``sandlot demo --keep`` and ``sandlot dev cluster up`` left
    under ``workdir``, from what they recorded there; what was stopped or removed.

    The programs go first (an agent would make sandboxes again), then the sandbox
    networks (through containerd while it runs, so their tasks die first), then
    containerd and its shims, the control plane in the reverse of its start order,
    and the demo's links. The state file goes last: after a crash halfway, the
    next ``down`` finds what is left."""
    done: list[str] = []
    cluster = LocalCluster.from_state(workdir)
    if cluster is not None:
        cluster.stop()
        done.append("the local cluster")
    state_file = workdir / "state.json"
    state = json.loads(state_file.read_text()) if state_file.exists() else {}
    running = _still_running(state.get("pids", {}), state.get("started", {}))
    late = ("containerd", *CONTROL_PLANE)
    done += _stop({n: p for n, p in running.items() if n not in late})
    network = DemoNetwork(workdir)
    ctrd = state.get("containerd")
    address = ctrd["address"] if ctrd and "containerd" in running else None
    released = network.release(address, state.get("nodes", []))
    if released:
        done.append(f"{released} sandbox network{'s' if released != 1 else ''} (CNI DEL)")
    done += _stop({n: p for n, p in running.items() if n == "containerd"})
    if ctrd:  # its shims and their containers, even when containerd itself died
        private = PrivateContainerd(Path(ctrd["root"]))
        private.stop()
        private.remove()
    for name in CONTROL_PLANE:
        done += _stop({n: p for n, p in running.items() if n == name})
    if "streamLink" in state and _delete_link(state["streamLink"]):
        done.append(f"stream address {state['streamLink']}")
    if network.remove_bridge():
        done.append(f"bridge {CNI_BRIDGE}")
    state_file.unlink(missing_ok=True)
    return done


def reset(workdir: Path) -> list[str]:
    """Stop what an earlier run left under ``workdir`` and drop its cluster's data, so
    the next control plane there starts empty (a failed or kept demo leaves etcd's
    data behind: its namespaces, nodes and pools would meet the next run)."""
    workdir = workdir.resolve()
    stopped = stop_left_over(workdir)
    shutil.rmtree(workdir / ETCD_DATA, ignore_errors=True)
    return stopped


def down(directory: str) -> int:
    """Stop what ``up``, ``sandlot demo --keep`` or ``dev cluster up`` left under
    ``directory``, and say what that was."""
    stopped = stop_left_over(Path(directory).resolve())
    print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
    return 0


def _start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks after boot), or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: fields resume after the last ')'.
    return int(stat.rsplit(")", 1)[1].split()[19])


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not; one of ours is reaped here)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def _still_running(pids: dict[str, int], started: dict[str, int | None]) -> dict[str, int]:
    """The recorded processes that still run: a pid recorded with its start time only
    while it is still that process (a start time of None: it had died already)."""
    return {
        name: pid
        for name, pid in pids.items()
        if _alive(pid) and (name not in started or _start_time(pid) == started[name])
    }


def _signal(pid: int, sig: signal.Signals) -> None:
    """``sig`` to the process, and to its group when it leads one (a detached start)."""
    with contextlib.suppress(ProcessLookupError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def _stop(procs: dict[str, int], timeout: float = 15.0) -> list[str]:
    """SIGTERM each process, SIGKILL what is left after ``timeout``; their names."""
    for pid in procs.values():
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in procs.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in procs.values():
        if _alive(pid):
            _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in procs.values()):
        if time.monotonic() > deadline:
            left = [n for n, p in procs.items() if _alive(p)]
            raise RuntimeError(f"{', '.join(left)} outlived SIGKILL for {timeout:g}s")
        time.sleep(0.1)
    return list(procs)


def _delete_link(name: str) -> bool:
    """Delete the link ``name``; whether it was there."""
    proc = subprocess.run(["ip", "link", "del", name], capture_output=True, timeout=30, check=False)
    return proc.returncode == 0
