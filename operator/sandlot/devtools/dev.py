"""``sandlot dev up|down``: a local control plane (etcd, kube-apiserver and
kube-controller-manager's garbage collector and namespace controller) with the
CRDs applied, in the background, for trying sandlot on one machine."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from sandlot.adapters.kube import apply_crds, load_api_client
from sandlot.api.crdgen import KINDS, crd_for
from sandlot.devtools.controlplane import ETCD_DATA, ControlPlane, kubectl_path, stop_detached


def start_local(workdir: Path) -> ControlPlane:
    """Start a detached control plane under ``workdir`` and apply the CRDs."""
    workdir = workdir.resolve()
    if (workdir / "state.json").exists():
        stop_detached(workdir)
    plane = ControlPlane(workdir=workdir, controller_manager=True)
    plane.start(detach=True)
    (workdir / "state.json").write_text(json.dumps(plane.state()))
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


def stop_left_over(workdir: Path) -> list[str]:
    """Stop what ``up`` (or ``sandlot demo --keep``) left running under ``workdir``."""
    state_file = workdir / "state.json"
    state = json.loads(state_file.read_text()) if state_file.exists() else {}
    stopped = stop_detached(workdir)
    if "containerd" in state:  # left by `sandlot demo --keep`: its shims and containers too
        from sandlot.devtools.containerd import PrivateContainerd

        ctrd = PrivateContainerd(Path(state["containerd"]["root"]))
        ctrd.stop()
        ctrd.remove()
    if "streamLink" in state:  # the demo's stream address
        subprocess.run(["ip", "link", "del", state["streamLink"]], capture_output=True, timeout=30)
    return stopped


def reset(workdir: Path) -> list[str]:
    """Stop what an earlier run left under ``workdir`` and drop its cluster's data, so
    the next control plane there starts empty (a failed or kept demo leaves etcd's
    data behind: its namespaces, nodes and pools would meet the next run)."""
    workdir = workdir.resolve()
    stopped = stop_left_over(workdir)
    shutil.rmtree(workdir / ETCD_DATA, ignore_errors=True)
    return stopped


def down(directory: str) -> int:
    """Stop what ``up`` (or ``sandlot demo --keep``) left running under ``directory``."""
    stopped = stop_left_over(Path(directory).resolve())
    print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
    return 0
