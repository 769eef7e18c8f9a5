"""A sandbox's readiness probe (``spec.readinessProbe``), shaped like a Pod's.

"Started is not ready": a Running sandbox whose process still loads its model or
warms its cache should get no traffic and no claim yet. The node's agent runs
the probe and keeps the sandbox's ``Ready`` condition; the operator routes,
claims and counts rollouts by it. A sandbox without a probe gets no ``Ready``
condition and is ready as soon as it is Running: no extra status write per
start, and sandboxes made before probes existed stay ready.

One handler (``exec``, ``httpGet``, ``tcpSocket``) and the Pod's timing fields
with the Pod's defaults; the bounds keep one probe's cost on its node bounded.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field, model_validator
from pydantic.config import JsonDict

from sandlot.api.common import MAX_ARG, MAX_ARGS, Model, PortNumber

MAX_PROBE_SECONDS = 3600
MAX_PROBE_TIMEOUT = 60
MAX_THRESHOLD = 100
MAX_HTTP_PATH = 2048

_Arg = Annotated[str, Field(max_length=MAX_ARG)]


class ExecAction(Model):
    command: list[_Arg] = Field(
        min_length=1,
        max_length=MAX_ARGS,
        description="Argv run in the sandbox as its own process runs (user, environment, "
        "limits); exit status 0 is success. No shell: wrap in `sh -c` for one.",
    )


class HttpGetAction(Model):
    path: str = Field(
        default="/",
        max_length=MAX_HTTP_PATH,
        pattern=r"^/[^\s]*$",
        description="Path of the GET request; a status from 200 to 399 is success.",
    )
    port: PortNumber = Field(description="Port on 127.0.0.1 in the sandbox's network.")


class TcpSocketAction(Model):
    port: PortNumber = Field(
        description="Port on 127.0.0.1 in the sandbox's network; an accepted connection is success."
    )


_ONE_HANDLER: JsonDict = {
    "x-kubernetes-validations": [
        {
            "rule": "[has(self.exec), has(self.httpGet), has(self.tcpSocket)]"
            ".filter(x, x).size() == 1",
            "message": "a readinessProbe has exactly one of exec, httpGet, tcpSocket",
            "reason": "FieldValueInvalid",
        }
    ]
}


class Probe(Model):
    """How the agent asks a Running sandbox whether it serves (as a Pod's readinessProbe)."""

    model_config = ConfigDict(json_schema_extra=_ONE_HANDLER)  # merged with Model's

    exec: ExecAction | None = Field(default=None, description="Run a command in the sandbox.")
    http_get: HttpGetAction | None = Field(
        default=None, description="GET a path on a port of the sandbox (plain HTTP)."
    )
    tcp_socket: TcpSocketAction | None = Field(
        default=None, description="Open a TCP connection to a port of the sandbox."
    )
    initial_delay_seconds: int = Field(
        default=0,
        ge=0,
        le=MAX_PROBE_SECONDS,
        description="Seconds after the process started before the first probe.",
    )
    period_seconds: int = Field(
        default=10, ge=1, le=MAX_PROBE_SECONDS, description="Seconds between probes."
    )
    timeout_seconds: int = Field(
        default=1,
        ge=1,
        le=MAX_PROBE_TIMEOUT,
        description="Seconds one probe may take; past them it failed (an exec is killed).",
    )
    success_threshold: int = Field(
        default=1,
        ge=1,
        le=MAX_THRESHOLD,
        description="Passes in a row that make a not-ready sandbox Ready.",
    )
    failure_threshold: int = Field(
        default=3,
        ge=1,
        le=MAX_THRESHOLD,
        description="Failures in a row that make a Ready sandbox not ready.",
    )

    @model_validator(mode="after")
    def _one_handler(self) -> Probe:
        handlers = [h for h in (self.exec, self.http_get, self.tcp_socket) if h is not None]
        if len(handlers) != 1:
            raise ValueError("a readinessProbe has exactly one of exec, httpGet, tcpSocket")
        return self


__all__ = [
    "ExecAction",
    "HttpGetAction",
    "Probe",
    "TcpSocketAction",
]
