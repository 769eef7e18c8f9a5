"""Starting a sandbox on this node: its checks, its image, its OCI spec, its
network and network policy, its container and task, then its Running status.

I/O only: what to start was decided by ``policy.agentsync``; how a spec becomes an
OCI spec by ``policy.ocispec``; which namespace level applies by
``policy.podsecurity``. A start either ends Running (written with the
resourceVersion it was decided on) or Failed with a reason naming the step that
failed. A Running write the API server could not take now (429, 5xx, no answer)
keeps the container that just started: the body is kept and written again by a
later pass, instead of tearing down a healthy sandbox over a busy API server. A
write refused for good, or onto a Sandbox that was deleted or ended meanwhile,
leaves no container behind (torn down as every stop does, ``agent.stops``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

from sandlot.adapters.cni import Attachment, CniError, join_netns
from sandlot.adapters.runtime import (
    ContainerInfo,
    ContainerSpec,
    ImageConfig,
    ImageTooLarge,
    NotFound,
    RuntimeError_,
    TaskInfo,
)
from sandlot.adapters.statuswrite import WriteOutcome, phase_of
from sandlot.agent.environment import Environment
from sandlot.agent.logwriter import LogWriter
from sandlot.agent.metrics import timed_phase
from sandlot.agent.netpolicy import NetworkPolicies, PlannedPolicy
from sandlot.agent.pulling import ImageGate, ImageNotReady, PullRefused
from sandlot.agent.rules import NamespaceRules, StartFailed
from sandlot.agent.runtimes import RuntimeClasses, discover
from sandlot.agent.status import running
from sandlot.agent.stops import Stops
from sandlot.agent.userns import UserRanges
from sandlot.agent.writecap import WriteCaps
from sandlot.api.common import key_of
from sandlot.api.keys import SANDBOX_LABEL, SANDBOX_UID_LABEL, USERNS_LABEL
from sandlot.api.reasons import SandboxReason
from sandlot.api.sandbox import SandboxPhase, SandboxSpec
from sandlot.policy.agentsync import UNSTARTED_PHASES
from sandlot.policy.capacity import Capacity, capacity_labels
from sandlot.policy.ephemeralstorage import limit_labels
from sandlot.policy.imageuser import UnknownImageUser
from sandlot.policy.nodesecurity import (
    IsolationUnavailable,
    NodeSecurity,
    apparmor_profile,
    check_user_namespace,
)
from sandlot.policy.ocispec import RunAsRootRefused, build_oci_spec
from sandlot.policy.runtimeclass import (
    RUNC,
    Discovery,
    RuntimeClassRefused,
    RuntimeHandler,
    as_pod_sandbox,
    host_view,
    with_executor,
    with_files_tool,
)
from sandlot.policy.sandboxlogs import log_stem

log = logging.getLogger(__name__)


def container_id_for(uid: str) -> str:
    """The container of a Sandbox is named after its uid: unique, and stable across restarts."""
    return f"sb-{uid}"


@dataclass(frozen=True)
class _Prepared:
    """A start that passed every check: what to create."""

    container_id: str
    image: str
    oci: dict[str, Any]
    labels: dict[str, str]
    log_stem: str
    attachment: Attachment | None
    network_policy: PlannedPolicy | None = None
    handler: RuntimeHandler | None = None


@dataclass(frozen=True)
class NodeFacts:
    """What a start needs to know of its node, probed once at start-up."""

    address: str
    limit_swap: bool
    node_capabilities: tuple[str, ...]
    security: NodeSecurity = field(default_factory=NodeSecurity)
    capacity: Capacity = field(default_factory=lambda: Capacity(sandboxes=110))
    runtimes: Discovery = field(default_factory=lambda: Discovery((RuntimeHandler(RUNC),)))
    containerd_version: str = ""
    files_tool: str | None = None  # the node's path of the files tool (adapters.filetool)
    executor: str | None = None  # the node's path of the executor (the same)


class Starts:
    """This node's sandbox starts on ``rt``, the connected runtime."""

    def __init__(
        self,
        stops: Stops,
        facts: NodeFacts,
        touch_image: Callable[[str], object],
        clock: Callable[[], datetime],
        image_gate: ImageGate | None = None,
        log_writer: LogWriter | None = None,
        sandboxes: Callable[[], list[dict[str, Any]]] = list,
        environment: Environment | None = None,
        fork_image: Callable[[Mapping[str, Any]], str | None] = lambda _sb: None,
    ) -> None:
        # Over the stops of the same node: its settings, API, runtime, network, status
        # writer and metrics; what a start undoes, it tears down as every stop does.
        settings, objects, rt = stops.settings, stops.objects, stops.rt
        self.stops = stops
        self.settings = settings
        self.environment = environment or Environment(lambda: None)  # references wait
        self.node = settings.node_name
        self.objects = objects
        self.rt = rt
        self.networking = stops.networking
        self.status = stops.status
        self.facts = facts
        self._unwritten = stops.unwritten  # kept where a stop of a deleted sandbox drops it
        self._touch_image = touch_image
        self._clock = clock
        self.rules = NamespaceRules(settings, objects)
        self.network_policies = NetworkPolicies(settings, objects, stops.metrics, sandboxes)
        self.image_gate = image_gate
        self.log_writer = log_writer
        self.call_timeout = settings.call_timeout.total_seconds()
        # The image a forked sandbox (spec.snapshotRef) starts from; None: not Ready here.
        self.fork_image = fork_image
        self.user_ranges = UserRanges()
        self.write_caps = WriteCaps(rt, self.call_timeout)
        self.runtime_classes = RuntimeClasses(
            objects.get_runtime_class,
            self.node,
            facts.runtimes,
            rediscover=partial(
                discover,
                settings.containerd_config,
                settings.runtimes_dir,
                quiet=True,
                containerd_version=facts.containerd_version,
            ),
            publish=lambda found: objects.patch_node_status(
                self.node, {"runtimeHandlers": [{"name": n} for n in found.names]}
            ),
        )

    def teardown_unstarted(self, key: str, container: ContainerInfo) -> None:
        """Tear down the container of a sandbox the watch shows unstarted (a start that
        failed half-way), once a fresh read agrees.

        The watched view lags the agent's own writes by an event's trip: a start that
        wrote Running just before this pass still looks Scheduled with a container,
        and must not be torn down for it. Rare, so the read costs nothing when idle.
        """
        current = self.stops.read_again(key, container)
        if current is not None and phase_of(current) in UNSTARTED_PHASES:
            pending = self._unwritten.get(key)
            same_sandbox = container.labels.get(SANDBOX_UID_LABEL) == current["metadata"]["uid"]
            if pending is not None and pending[0] == container.id and same_sandbox:
                self._write_running(current, container, pending[1])
                return
            self.stops.teardown(container)
        # Otherwise the watch is behind: its event wakes a pass that sees the truth.

    def start_sandbox(self, sb: Mapping[str, Any]) -> None:
        image = str((sb.get("spec") or {}).get("image", ""))
        forked = None
        if (sb.get("spec") or {}).get("snapshotRef"):
            forked = self.fork_image(sb)  # pinned by the collector while its snapshot lives
            if forked is None:
                return  # its snapshot is not Ready on this node yet: the next sync looks again
        # Held from the image check to the container: the collector must not evict it.
        with self.image_gate.pulls.hold(image) if self.image_gate else contextlib.nullcontext():
            self._start(sb, forked)

    def _start(self, sb: Mapping[str, Any], forked: str | None = None) -> None:
        metrics = self.stops.metrics
        try:
            with timed_phase(metrics, "prepare"):
                prepared = self._prepare(sb, forked)
                if prepared is None:
                    return  # level unknown, or the image on its way: the next sync goes on
                # Before the container exists nothing else protects its image from the
                # collector: the fresh last-used label makes it too young (minAge) to go.
                self._touch_image(prepared.image)
            with timed_phase(metrics, "create"):
                created = self._create(prepared)
            if created is None:
                return  # a leftover of that name was torn down: the next sync starts it
            with timed_phase(metrics, "caps"):
                self.write_caps.apply(prepared.container_id, prepared.labels)
            with timed_phase(metrics, "network"):
                ip = self._attach(prepared, created)
            with timed_phase(metrics, "task"):
                task = self._run(prepared, created)
        except StartFailed as exc:
            self.fail(sb, exc.reason, str(exc))
            return
        finally:  # created, or given up: a container label now holds the range, or none
            self.user_ranges.release(container_id_for(sb["metadata"]["uid"]))
        with timed_phase(metrics, "status"):
            self._record_running(sb, prepared, created, task, ip)

    def _record_running(
        self,
        sb: Mapping[str, Any],
        prepared: _Prepared,
        created: ContainerInfo,
        task: TaskInfo,
        ip: str,
    ) -> None:
        status = running(self.node, prepared.container_id, task.pid, ip, self._clock())
        self._write_running(sb, created, status)

    def _write_running(
        self, sb: Mapping[str, Any], container: ContainerInfo, status: dict[str, Any]
    ) -> None:
        key = key_of(sb)
        outcome = self.status.write(sb, status, allowed_from=UNSTARTED_PHASES)
        if outcome is WriteOutcome.WRITTEN:
            self._unwritten.pop(key, None)
            log.info("sandbox %s running: container %s pid %s", key, container.id, status["pid"])
        elif outcome in (WriteOutcome.FAILED, WriteOutcome.CONFLICTED):
            # The API server is busy or racing: the sandbox runs; a later pass writes it.
            self._unwritten[key] = (container.id, status)
            log.info("sandbox %s: Running not written (%s): kept for a later pass", key, outcome)
        else:
            self._unwritten.pop(key, None)
            log.info("sandbox %s was %s while starting: tearing its container down", key, outcome)
            self.stops.teardown(container)

    def restart_from(
        self, sb: Mapping[str, Any], image: str
    ) -> tuple[ContainerInfo, dict[str, Any]] | None:
        """A new container for Running ``sb`` from ``image`` (its committed filesystem),
        started; its Running status fields to write. None: not now (the next pass
        tries again); ``StartFailed``: refused."""
        try:
            prepared = self._prepare(sb, image)
            if prepared is None:
                return None
            created = self._create(prepared)
            if created is None:
                return None
            self.write_caps.apply(prepared.container_id, prepared.labels)
            ip = self._attach(prepared, created)
            task = self._run(prepared, created)
        finally:
            self.user_ranges.release(container_id_for(sb["metadata"]["uid"]))
        return created, running(self.node, prepared.container_id, task.pid, ip, self._clock())

    def _prepare(self, sb: Mapping[str, Any], committed: str | None = None) -> _Prepared | None:
        limited = self.rules.for_start(sb)
        if limited is None:
            return None
        spec, pids = limited
        at_node_address = not self.networking.enabled or spec.host_network
        if at_node_address:
            self.network_policies.check_node_ports(spec)
        try:
            _, handler = self.runtime_classes.resolve(sb.get("spec") or {})
        except RuntimeClassRefused as exc:
            raise StartFailed(exc.reason, str(exc)) from None
        except Exception as exc:  # the API server did not answer: the next pass asks again
            log.warning("sandbox %s: its RuntimeClass cannot be read: %s", key_of(sb), exc)
            return None
        if self.image_gate is not None:  # a committed image: only whose it is
            try:
                self.image_gate.check(sb, spec, committed)
            except ImageNotReady:
                return None
            except PullRefused as exc:
                raise StartFailed(exc.reason, str(exc)) from None
        planned: PlannedPolicy | None = None
        if not at_node_address and self.network_policies.enabled:  # with the image here
            planned = self.network_policies.prepare(sb, spec)
            if planned is None:
                return None
        meta = sb["metadata"]
        ready, variables = self.environment.for_start(self.status, sb, spec)
        if not ready:
            return None  # held: CreateContainerConfigError, the next sync tries again
        image = committed or str((sb.get("spec") or {}).get("image", ""))
        container_id = container_id_for(meta["uid"])
        config = self._image_config(image)
        oci = self._oci_spec(container_id, meta["name"], spec, config, pids, variables)
        oci = with_files_tool(as_pod_sandbox(oci, handler), self.facts.files_tool, handler)
        oci = with_executor(oci, self.facts.executor, handler)
        attachment = self._plan_network(container_id, spec, oci, handler)
        labels = {SANDBOX_LABEL: key_of(sb), SANDBOX_UID_LABEL: meta["uid"]}
        labels.update(limit_labels(spec) | capacity_labels(spec))  # for storage, capacity
        if attachment is not None:
            labels.update(attachment.labels())
        if spec.host_users is False:  # a range of its own, reserved until _start ends
            oci = self.user_ranges.map(
                container_id, oci, labels, self.rt.list_containers, timeout=self.call_timeout
            )
        stem = log_stem(meta["namespace"], meta["name"], meta["uid"])
        return _Prepared(container_id, image, oci, labels, stem, attachment, planned, handler)

    def _image_config(self, image: str) -> ImageConfig:
        """The image's config from the node's content store; a refusal fails the start."""
        try:
            return self.rt.image_config(image, timeout=self.call_timeout)
        except NotFound as exc:
            raise StartFailed(
                SandboxReason.IMAGE_NOT_FOUND, f"image {image} is not on node {self.node}: {exc}"
            ) from None
        except ImageTooLarge as exc:
            raise StartFailed(
                SandboxReason.IMAGE_TOO_LARGE, f"image {image} refused: {exc}"
            ) from None
        except RuntimeError_ as exc:
            raise StartFailed(
                SandboxReason.IMAGE_UNAVAILABLE, f"image {image} cannot be read: {exc}"
            ) from None

    def _oci_spec(
        self,
        container_id: str,
        hostname: str,
        spec: SandboxSpec,
        config: ImageConfig,
        pids: int,
        variables: list[str] | None,
    ) -> dict[str, Any]:
        """The OCI spec of the sandbox's container; what the node cannot honour fails it."""
        privileged = bool(spec.security_context and spec.security_context.privileged)
        try:
            check_user_namespace(self.facts.security, spec.host_users)
            profile = apparmor_profile(
                self.facts.security, self.settings.apparmor_profile, privileged=privileged
            )
            return build_oci_spec(
                container_id,
                spec,
                config,
                hostname=hostname,
                pids_limit=pids,
                limit_swap=self.facts.limit_swap,
                node_capabilities=self.facts.node_capabilities,
                apparmor_profile=profile,
                cgroup_parent=self.settings.cgroup_parent,
                env=variables,
            )
        except RunAsRootRefused as exc:
            raise StartFailed(SandboxReason.RUN_AS_ROOT, str(exc)) from None
        except IsolationUnavailable as exc:
            raise StartFailed(exc.reason, str(exc)) from None
        except UnknownImageUser as exc:
            raise StartFailed(SandboxReason.IMAGE_USER_NOT_FOUND, str(exc)) from None
        except ValueError as exc:
            raise StartFailed(SandboxReason.INVALID_SPEC, str(exc)) from None

    def _plan_network(
        self,
        container_id: str,
        spec: SandboxSpec,
        oci: dict[str, Any],
        handler: RuntimeHandler | None,
    ) -> Attachment | None:
        """CNI's namespace; without CNI, runc's own, or for a handler with no host
        view (runsc, which leaves a fresh namespace's loopback down) the agent's,
        with only its loopback up."""
        if spec.host_network:
            return None
        if not self.networking.enabled:
            if handler is None or host_view(handler.shim) or not self.networking.own_namespaces:
                return None
            attachment = self.networking.plan_loopback(container_id)
            join_netns(oci, attachment.netns_path)
            return attachment
        try:
            attachment = self.networking.plan(container_id)
        except CniError as exc:
            raise StartFailed(SandboxReason.NETWORK_SETUP_FAILED, str(exc)) from None
        join_netns(oci, attachment.netns_path)
        return attachment

    def _create(self, prepared: _Prepared) -> ContainerInfo | None:
        image, container_id = prepared.image, prepared.container_id
        try:
            return self.rt.create_container(
                ContainerSpec(
                    id=container_id,
                    image=image,
                    oci_spec=prepared.oci,
                    labels=prepared.labels,
                    handler=prepared.handler,
                ),
                # A user namespace's root filesystem is a copy of the image: a pull's budget.
                timeout=self.settings.image_pull_deadline.total_seconds()
                if USERNS_LABEL in prepared.labels
                else self.call_timeout,
            )
        except NotFound as exc:
            raise StartFailed(
                SandboxReason.IMAGE_NOT_FOUND,
                f"image {image} is not usable on node {self.node}: {exc}",
            ) from None
        except RuntimeError_ as exc:
            if exc.code == "already_exists":
                key = prepared.labels[SANDBOX_LABEL]
                log.warning("sandbox %s: container %s exists: tearing it down", key, container_id)
                self.stops.teardown(container_id)
                return None
            raise StartFailed(
                SandboxReason.CREATE_FAILED, f"cannot create a container from image {image}: {exc}"
            ) from None

    def _attach(self, prepared: _Prepared, created: ContainerInfo) -> str:
        """The sandbox's address: its CNI one, attached with its network policy before
        the task starts (the sandbox never runs without them), or the node's."""
        if prepared.attachment is None:
            return self.facts.address
        try:
            result = self.networking.attach(prepared.attachment, prepared.labels)
        except CniError as exc:
            # One DEL for what a partial chain made; plugins undo their own failed
            # ADD, and a configuration that cannot ADD cannot DEL either.
            self.stops.teardown(created, release_patience=0)
            raise StartFailed(SandboxReason.NETWORK_SETUP_FAILED, str(exc)) from None
        if prepared.network_policy is not None:
            try:
                self.network_policies.install(
                    prepared.labels[SANDBOX_LABEL],
                    prepared.container_id,
                    prepared.network_policy,
                    prepared.attachment.netns_path,
                    [ip.address for ip in result.ips],
                )
            except StartFailed:
                self.stops.teardown(created)
                raise
        return result.primary_ip(prepared.attachment.ifname) or self.facts.address

    def _run(self, prepared: _Prepared, created: ContainerInfo) -> TaskInfo:
        container_id = prepared.container_id
        try:  # output read by the agent from the start: the log is capped as written
            stdio = self.log_writer.attach(prepared.log_stem) if self.log_writer else ""
            return self.rt.start_task(container_id, stdio=stdio, timeout=self.call_timeout)
        except OSError as exc:
            self.stops.teardown(created)
            message = f"cannot read the output of {container_id}: {exc}"
            raise StartFailed(SandboxReason.START_FAILED, message) from None
        except RuntimeError_ as exc:
            self.stops.teardown(created)
            raise StartFailed(
                SandboxReason.START_FAILED, f"container {container_id} did not start: {exc}"
            ) from None

    def hold(self, sb: Mapping[str, Any], reason: str, message: str) -> None:
        """Keep ``sb`` Scheduled, saying why it is not started (written once)."""
        current = sb.get("status") or {}
        if (current.get("reason"), current.get("message")) == (reason, message):
            return
        body = {"phase": SandboxPhase.SCHEDULED.value, "reason": str(reason), "message": message}
        self.status.write(sb, body, allowed_from=UNSTARTED_PHASES)

    def fail(self, sb: Mapping[str, Any], reason: str, message: str) -> None:
        log.warning("sandbox %s failed: %s: %s", key_of(sb), reason, message)
        self.status.end(sb, SandboxPhase.FAILED, reason, message)


__all__ = ["NodeFacts", "StartFailed", "Starts", "container_id_for"]
