"""The stream gateway's settings: one model, validated at start; every field is a
flag (``--agent-port``) and a ``SANDLOT_*`` variable, as for the other programs."""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field, model_validator

from sandlot.api.settings import Duration, ListenPort, PemPath, SettingsModel, require_positive


class GatewaySettings(SettingsModel):
    namespace: str = Field(
        default="sandlot-system",
        min_length=1,
        max_length=63,
        description="Namespace of the agent pods (sandlot's namespace).",
    )
    bind: str = Field(
        default="", max_length=253, description="Address to listen on (empty: every address)."
    )
    port: ListenPort = Field(
        default=8443,
        description="HTTPS port the API server's front proxy reaches (the APIService's "
        "Service); 0: any free port.",
    )
    router: bool = Field(
        default=False,
        description="Also serve agent-sandbox's router protocol (/execute, /upload, "
        "/download, /list, /exists) as the aggregated API router.sandlot.dev, on "
        "router_port (docs/agent-sandbox.md).",
    )
    router_port: ListenPort = Field(
        default=8444,
        description="HTTPS port of the router's APIService, when router is on; 0: any free port.",
    )
    tls_cert: PemPath = Field(
        min_length=1,
        description="PEM file of the gateway's certificate: it serves the API server with it "
        "and presents it to the agents as a client (common name sandlot-gateway, issued by "
        "the gateway's own CA, the only client CA the agents trust).",
    )
    tls_key: PemPath = Field(min_length=1, description="PEM file of its key.")
    stream_ca: PemPath = Field(
        min_length=1,
        description="PEM file of sandlot's agent CA, the only CA the gateway trusts for "
        "agents: each agent's serving certificate names its node, and the gateway checks it "
        "names the node of the sandbox it dials (<node>.agent.sandlot.internal).",
    )
    agent_selector: str = Field(
        default="app.kubernetes.io/name=sandlot,app.kubernetes.io/component=agent",
        min_length=1,
        max_length=1024,
        description="Label selector of the agent pods in namespace; a sandbox's agent is "
        "the Running one of them bound to the sandbox's spec.nodeName, at its container "
        "port named stream.",
    )
    requestheader_client_ca: PemPath = Field(
        default="",
        description="PEM file of the front-proxy CA. Empty: read from kube-system's "
        "extension-apiserver-authentication ConfigMap (with the header names), as every "
        "aggregated API server does, and re-read every requestheader_refresh.",
    )
    requestheader_refresh: Duration = Field(
        default=timedelta(minutes=5),
        description="How often the front-proxy CA and header names, and the gateway's own "
        "certificate files, are re-read (new connections trust exactly the CAs now named: "
        "a CA added is trusted, one removed is not any more; a new "
        "certificate used for new connections, with no restart).",
    )
    max_sessions: int = Field(
        default=256, ge=1, le=100_000, description="Streams open at once in this replica."
    )
    max_sessions_per_user: int = Field(
        default=32, ge=1, le=100_000, description="Streams one user may have open at once."
    )
    max_sessions_per_namespace: int = Field(
        default=64,
        ge=1,
        le=100_000,
        description="Streams the ServiceAccounts of one namespace (users "
        "system:serviceaccount:<namespace>:<name>) may have open at once, together: "
        "making more ServiceAccounts does not multiply a tenant's share.",
    )
    max_sessions_per_group: int = Field(
        default=128,
        ge=1,
        le=100_000,
        description="Streams the members of one group may have open at once, together, "
        "for each group the API server names for a caller (not system:authenticated, "
        "system:serviceaccounts or a namespace's system:serviceaccounts:<namespace>): "
        "minting more users of one group does not multiply its share.",
    )
    call_timeout: Duration = Field(
        default=timedelta(seconds=10),
        description="Deadline of every API call and of reaching an agent (TLS and upgrade).",
    )
    review_cache_ttl: Duration = Field(
        default=timedelta(seconds=5),
        description="How long an allowed access review is reused for exactly the same "
        "question (user, groups, extra, uid, verb, subresource, namespace, name), counted "
        "from when it was asked: a revoked permission is honoured at most this late. "
        "Denials are never reused. 0: every stream asks the API server.",
    )
    review_cache_size: int = Field(
        default=10_000,
        ge=1,
        le=1_000_000,
        description="Allowed access reviews kept at most (the oldest go first).",
    )
    idle_timeout: Duration = Field(
        default=timedelta(minutes=15),
        description="A relayed stream in which nothing moved either way this long is "
        "closed on both sides and its caps freed (longer than the agent's "
        "stream_idle_timeout, which ends quiet streams first).",
    )
    metrics_port: ListenPort = Field(
        default=8080,
        description="Port of /metrics, /livez and /readyz (plain HTTP); 0: off.",
    )

    @model_validator(mode="after")
    def _check(self) -> GatewaySettings:
        require_positive(self, ("requestheader_refresh", "call_timeout", "idle_timeout"))
        if self.review_cache_ttl < timedelta(0):
            raise ValueError("review_cache_ttl must not be negative")
        for name in (
            "max_sessions_per_user",
            "max_sessions_per_namespace",
            "max_sessions_per_group",
        ):
            if getattr(self, name) > self.max_sessions:
                raise ValueError(
                    f"{name} ({getattr(self, name)}) must not exceed "
                    f"max_sessions ({self.max_sessions})"
                )
        return self


__all__ = ["GatewaySettings"]
