"""A control plane of a test's own, for tests that stop, freeze or restart parts of
it (the shared one serves every other test of the worker)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from sandlot.adapters.kube import apply_crds, load_api_client
from sandlot.api.crdgen import KINDS, crd_for
from sandlot.devtools.controlplane import ControlPlane


@pytest.fixture
def own_plane(tmp_path: Path) -> Iterator[ControlPlane]:
    plane = ControlPlane(workdir=tmp_path / "cp")
    plane.start()
    api = load_api_client(str(plane.kubeconfig))
    apply_crds(api, [crd_for(k) for k in KINDS])
    core = client.CoreV1Api(api)
    for ns in ("work", "sandlot-system"):
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    api.close()
    yield plane
    plane.stop()
