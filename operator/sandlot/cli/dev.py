"""``sandlot dev up|down``: a local control plane (etcd + kube-apiserver) with the
CRDs applied, in the background, for trying sandlot on one machine."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from sandlot.adapters.controlplane import ControlPlane, kubectl_path, stop_detached
from sandlot.adapters.kube import apply_crds, load_api_client
from sandlot.api.crdgen import KINDS, crd_for

DEFAULT_DIR = ".dev"


def register(sub: Any) -> None:
    dev = sub.add_parser("dev", help="a local control plane for trying sandlot")
    dev_sub = dev.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = dev_sub.add_parser("up", help="start etcd + kube-apiserver and apply the CRDs")
    up.add_argument("--dir", default=DEFAULT_DIR, help=f"state directory (default: {DEFAULT_DIR})")
    up.set_defaults(func=run_up)
    down = dev_sub.add_parser("down", help="stop what `dev up` started")
    down.add_argument(
        "--dir", default=DEFAULT_DIR, help=f"state directory (default: {DEFAULT_DIR})"
    )
    down.set_defaults(func=run_down)


def start_local(workdir: Path) -> ControlPlane:
    """Start a detached control plane under ``workdir`` and apply the CRDs."""
    workdir = workdir.resolve()
    if (workdir / "state.json").exists():
        stop_detached(workdir)
    plane = ControlPlane(workdir=workdir)
    plane.start(detach=True)
    (workdir / "state.json").write_text(json.dumps(plane.state()))
    api = load_api_client(str(plane.kubeconfig))
    try:
        apply_crds(api, [crd_for(k) for k in KINDS])
    finally:
        api.close()
    return plane


def run_up(args: argparse.Namespace) -> int:
    workdir = Path(args.dir)
    print(f"starting etcd and kube-apiserver under {workdir.resolve()} ...", flush=True)
    plane = start_local(workdir)
    kubectl = kubectl_path()
    print(f"control plane up at {plane.url}; CRDs applied.")
    print("next:")
    print(f"  export KUBECONFIG={plane.kubeconfig}")
    print(f"  {kubectl} get sandboxes -A")
    print(f"  {kubectl} api-resources --categories=sandlot")
    print(f"stop it with: sandlot dev down --dir {args.dir}")
    return 0


def run_down(args: argparse.Namespace) -> int:
    workdir = Path(args.dir).resolve()
    state_file = workdir / "state.json"
    state = json.loads(state_file.read_text()) if state_file.exists() else {}
    stopped = stop_detached(workdir)
    if "containerd" in state:  # left by `sandlot demo --keep`: its shims and containers too
        from sandlot.adapters.containerd.local import PrivateContainerd

        ctrd = PrivateContainerd(Path(state["containerd"]["root"]))
        ctrd.stop()
        ctrd.remove()
    print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
    return 0
