"""Fixtures for the real control plane: etcd + kube-apiserver on loopback.

One control plane per pytest worker (session scope), the CRDs applied from the
models; every test that creates namespaced objects gets its own namespace.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client

from sandlot.adapters.kube import apply_crds, load_api_client
from sandlot.api.crdgen import KINDS, crd_for
from sandlot.devtools.controlplane import ControlPlane, kubectl_path
from tests.support.wait import wait_for

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    # With kube-controller-manager's garbage collector and namespace controller, as a
    # cluster has them: deleting an owner or a namespace ends what it owned.
    plane = ControlPlane(workdir=tmp_path_factory.mktemp("controlplane"), controller_manager=True)
    plane.start()
    try:
        api = load_api_client(str(plane.kubeconfig))
        apply_crds(api, [crd_for(k) for k in KINDS])
        api.close()
        yield plane
    finally:
        plane.stop()


def start_private_plane(
    workdir: Path,
    *,
    extra_flags: list[str] | None = None,
    namespaces: tuple[str, ...] = (),
    apiserver_env: dict[str, str] | None = None,
) -> ControlPlane:
    """A control plane of one test's own (for tests that stop, freeze or audit it),
    with sandlot's CRDs and ``namespaces`` created. The caller stops it."""
    plane = ControlPlane(
        workdir=workdir,
        extra_apiserver_flags=list(extra_flags or []),
        apiserver_env=dict(apiserver_env or {}),
    )
    plane.start()
    try:
        api = load_api_client(str(plane.kubeconfig))
        apply_crds(api, [crd_for(k) for k in KINDS])
        core = client.CoreV1Api(api)
        for ns in namespaces:
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        api.close()
    except BaseException:
        plane.stop()
        raise
    return plane


@pytest.fixture(scope="session")
def kube(control_plane: ControlPlane) -> Iterator[client.ApiClient]:
    api = load_api_client(str(control_plane.kubeconfig))
    yield api
    api.close()


@pytest.fixture
def namespace(kube: client.ApiClient) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(kube)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    core.delete_namespace(name)


@pytest.fixture(scope="session")
def kubectl(control_plane: ControlPlane) -> Kubectl:
    binary = str(kubectl_path())

    def run(
        *args: str, timeout: float = 30, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, KUBECONFIG=str(control_plane.kubeconfig))
        proc = subprocess.run(
            [binary, *args],
            env=env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc

    return run


def as_node_identity(
    kube: client.ApiClient, plane: ControlPlane, namespace: str, node: str
) -> client.ApiClient:
    """A client holding a token the API server issued for the node's agent identity
    (``sandlot-agent-<node>`` in ``namespace``, made when its Secret was brokered)."""
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600)
    )
    issued = client.CoreV1Api(kube).create_namespaced_service_account_token(
        f"sandlot-agent-{node}", namespace, request
    )
    assert issued.status is not None, f"no token issued for sandlot-agent-{node}"
    token = issued.status.token
    config = client.Configuration(host=plane.url)
    config.ssl_ca_cert = str(plane.ca_file)
    config.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(config)


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def agent_sandbox_crds(api: client.ApiClient, *, timeout: float = 60.0) -> Iterator[None]:
    """agent-sandbox's CRDs for one test or module, removed after (and waited for):
    their ``agents.x-k8s.io`` Sandbox shares sandlot's plural, so while they stand
    ``kubectl get sandboxes`` on the shared control plane names theirs."""
    from sandlot.api.agentsandbox import AGENT_SANDBOX_KINDS

    names = apply_crds(api, [crd_for(k) for k in AGENT_SANDBOX_KINDS])
    try:
        yield
    finally:
        ext = client.ApiextensionsV1Api(api)
        for name in names:
            try:
                ext.delete_custom_resource_definition(name)
            except client.ApiException as e:
                if e.status != 404:
                    raise
        left = set(names)

        def gone() -> bool:
            for name in sorted(left):
                try:
                    ext.read_custom_resource_definition(name)
                except client.ApiException as e:
                    if e.status != 404:
                        raise
                    left.discard(name)
            assert not left, f"still there: {sorted(left)}"
            return True

        wait_for(
            gone, timeout=timeout, what="agent-sandbox's CRDs gone after their delete", interval=0.2
        )
