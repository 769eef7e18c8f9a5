"""`sandlot demo` starts from an empty cluster whatever an earlier run left in its
directory: a kept run's control plane still running, or a failed run's etcd data
(whose namespaces made the next run fail with "already exists")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandlot.adapters.kube import load_api_client
from sandlot.devtools.controlplane import ETCD_DATA, ControlPlane, stop_detached
from sandlot.devtools.dev import reset

pytestmark = pytest.mark.integration


def start_detached(workdir: Path) -> None:
    """What ``sandlot dev up`` starts, less the controller manager and the CRDs (the
    etcd data and the state file are what an earlier run leaves)."""
    plane = ControlPlane(workdir=workdir)
    plane.start(detach=True)
    (workdir / "state.json").write_text(json.dumps(plane.state()))


def create_namespace(workdir: Path, name: str) -> None:
    api = load_api_client(str(workdir / "kubeconfig"))
    try:
        client.CoreV1Api(api).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=name))
        )
    finally:
        api.close()


def test_reset_stops_an_earlier_control_plane_and_drops_its_data(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    try:
        start_detached(workdir)
        create_namespace(workdir, "sandlot-system")
        assert (workdir / ETCD_DATA).is_dir()

        stopped = reset(workdir)

        assert {"etcd", "kube-apiserver"} <= set(stopped), stopped
        assert not (workdir / "state.json").exists()
        assert not (workdir / ETCD_DATA).exists()
        start_detached(workdir)
        try:
            create_namespace(workdir, "sandlot-system")
        except ApiException as e:
            pytest.fail(f"the next run found the earlier run's cluster: {e.status} {e.reason}")
    finally:
        stop_detached(workdir)
