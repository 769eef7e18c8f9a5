"""A stand-in Pod for an agent that runs as a plain process (the local control plane).

The API server proxies ``sandlot logs`` / ``sandlot exec`` to an agent only as
the pods/proxy of a Pod whose IP it is (``policy.streams.proxy_path``). In a
cluster that is the agent's own pod, reported by the kubelet. Without a kubelet
the dev tooling records a Pod of the same shape itself: never scheduled (no
``nodeName``, so nothing runs it or garbage-collects it), its status carrying
the address the agent's stream server listens on.
"""

from __future__ import annotations

from kubernetes import client
from kubernetes.client.rest import ApiException

STANDIN_COMPONENT = "agent-standin"


def publish_agent_pod(api: client.ApiClient, namespace: str, name: str, ip: str, port: int) -> None:
    """Create the stand-in Pod ``name`` (if missing) and set its IP to ``ip``."""
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
            containers=[
                client.V1Container(
                    name="agent",
                    image="sandlot-agent-standin",
                    ports=[client.V1ContainerPort(name="stream", container_port=port)],
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


__all__ = ["STANDIN_COMPONENT", "publish_agent_pod", "remove_agent_pod"]
