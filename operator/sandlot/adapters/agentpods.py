"""Where a node's agent is: its pod's IP, as the stream gateway finds it.

The gateway resolves a sandbox's node to the Running agent pod bound to that node
(``agent_address``), never to anything a node writes about itself. In a cluster
that is the DaemonSet's pod, its IP reported by the kubelet. Without a kubelet
(the local control plane) the dev tooling records a stand-in Pod of the same
shape itself (``publish_agent_pod``): bound to the node by ``nodeName`` but with
no kubelet to run it, its status carrying the address the agent's stream server
listens on.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandlot.api.common import GROUP, SANDBOXES, VERSION

STANDIN_COMPONENT = "agent-standin"


class NoAgent(Exception):
    """No Running agent pod with an IP is bound to the node."""


class SandboxNotFound(Exception):
    """The Sandbox does not exist."""


def sandbox_placement(
    api: client.ApiClient, namespace: str, name: str, *, timeout: float
) -> tuple[str, str]:
    """(``spec.nodeName``, ``status.phase``) of the Sandbox; empty strings when unset."""
    try:
        custom: Any = client.CustomObjectsApi(api)
        sandbox = custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, SANDBOXES, name, _request_timeout=timeout
        )
    except ApiException as e:
        if e.status == 404:
            raise SandboxNotFound(f'sandbox "{name}" not found in namespace {namespace}') from None
        raise
    node = str((sandbox.get("spec") or {}).get("nodeName") or "")
    return node, str((sandbox.get("status") or {}).get("phase") or "")


STREAM_PORT_NAME = "stream"


def agent_address(
    api: client.ApiClient, namespace: str, selector: str, node: str, *, timeout: float
) -> tuple[str, int]:
    """(IP, stream port) of the Running agent pod (``selector`` in ``namespace``) on
    ``node``: the IP its kubelet reports, the port its spec names ``stream`` (a spec
    no node can change)."""
    pods = client.CoreV1Api(api).list_namespaced_pod(
        namespace,
        label_selector=selector,
        field_selector=f"spec.nodeName={node}",
        _request_timeout=timeout,
    )
    for pod in pods.items:
        status = pod.status
        ports = [
            port.container_port
            for container in (pod.spec.containers if pod.spec else ())
            for port in container.ports or ()
            if port.name == STREAM_PORT_NAME
        ]
        if status is not None and status.phase == "Running" and status.pod_ip and ports:
            return str(status.pod_ip), int(ports[0])
    raise NoAgent(
        f"no Running agent pod ({selector}) with a {STREAM_PORT_NAME!r} port on node {node} "
        f"in namespace {namespace}"
    )


def publish_agent_pod(
    api: client.ApiClient, namespace: str, name: str, ip: str, port: int, node: str
) -> None:
    """Create the stand-in Pod ``name`` of ``node``'s agent (if missing) and set its IP
    to ``ip``."""
    core = client.CoreV1Api(api)
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(
            name=name,
            labels={
                "app.kubernetes.io/name": "sandlot",
                "app.kubernetes.io/component": STANDIN_COMPONENT,
            },
        ),
        spec=client.V1PodSpec(
            node_name=node,
            containers=[
                client.V1Container(
                    name="agent",
                    image="sandlot-agent-standin",
                    ports=[client.V1ContainerPort(name=STREAM_PORT_NAME, container_port=port)],
                )
            ],
        ),
    )
    try:
        core.create_namespaced_pod(namespace, pod)
    except ApiException as e:
        if e.status != 409:
            raise
    status = {"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}}
    core.patch_namespaced_pod_status(name, namespace, status)


def remove_agent_pod(api: client.ApiClient, namespace: str, name: str) -> None:
    try:
        client.CoreV1Api(api).delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    except ApiException as e:
        if e.status != 404:
            raise


__all__ = [
    "STANDIN_COMPONENT",
    "NoAgent",
    "SandboxNotFound",
    "agent_address",
    "publish_agent_pod",
    "remove_agent_pod",
    "sandbox_placement",
]
