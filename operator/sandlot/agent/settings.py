"""The agent's settings: one model, validated at start; flags (``--kill-wait``) and
environment variables (``SANDLOT_KILL_WAIT``) are derived from it by
``sandlot.cli.options``. A bad value is refused before anything connects, with a
message naming the setting.

The bounds here are the agent's promise that nothing waits forever: ``kill_wait``
caps the wait for a task's exit, ``call_timeout`` caps every single containerd
call, and ``teardown_concurrency`` caps how many teardowns run at once (so a
wedged shim holds one slot, never the node).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field, field_validator, model_validator

from sandlot.agent.netsettings import NetworkSettings
from sandlot.agent.pullsettings import PullSettings
from sandlot.api.admission import Level
from sandlot.api.sandbox import MIN_CPU_LIMIT, MIN_MEMORY_LIMIT, Quantity
from sandlot.api.settings import Duration, ListenPort, PemPath, PositiveDuration
from sandlot.policy import limits
from sandlot.policy.imagegc import GcThresholds
from sandlot.policy.netpolicy import ClusterDefault, parse_cidr_list
from sandlot.policy.pulling import check_allowlist
from sandlot.policy.quantity import parse_quantity
from sandlot.policy.syncpacing import Pacing


class AgentSettings(NetworkSettings, PullSettings):
    node_name: str = Field(
        min_length=1,
        max_length=253,
        description="Name of this node's SandboxNode (and of its Lease); usually the "
        "Kubernetes node name.",
    )
    containerd_address: str = Field(
        default="/run/containerd/containerd.sock",
        min_length=1,
        description="containerd's gRPC socket.",
    )
    containerd_namespace: str = Field(
        default="sandlot",
        min_length=1,
        description="containerd namespace of the agent's containers and images (kept "
        "apart from the kubelet's k8s.io). Every container in it is the agent's.",
    )
    containerd_config: str = Field(
        default="/etc/containerd/config.toml",
        min_length=1,
        max_length=256,
        description="containerd's configuration file (as the agent sees it): its CRI "
        "runtimes are the runtime handlers the node offers (status.runtimeHandlers), each "
        "only when its binaries exist; runc always. A missing file offers runc alone.",
    )
    runtimes_dir: str = Field(
        default="",
        max_length=256,
        description="Directory of containerd configuration fragments (*.toml) declaring "
        "more runtime handlers beside containerd_config's, as a runtime installer (the "
        "chart's) writes them; read again on the sync passes (at most every 10 s), so a "
        "runtime installed later is offered without restarts. Empty: none.",
    )
    containerd_root: str = Field(
        default="/var/lib/containerd",
        min_length=1,
        description="containerd's root directory: disk usage for image GC is measured on "
        "the filesystem holding it.",
    )
    namespace: str = Field(
        default="sandlot-system",
        min_length=1,
        description="Namespace of the node Leases (the operator's namespace setting).",
    )
    lease_duration: PositiveDuration = Field(
        default=timedelta(seconds=60),
        description="leaseDurationSeconds of the node Lease: the node is READY while "
        "renewTime + this is in the future.",
    )
    renew_interval: PositiveDuration = Field(
        default=timedelta(seconds=10),
        description="How often the Lease is renewed; must be below lease_duration.",
    )
    kill_wait: PositiveDuration = Field(
        default=timedelta(seconds=10),
        description="Longest wait for a killed task's exit; a wedged shim never sends it, "
        "so teardown logs a warning and goes on after this.",
    )
    call_timeout: PositiveDuration = Field(
        default=timedelta(seconds=5),
        description="Deadline of each single containerd call.",
    )
    stop_grace: Duration = Field(
        default=timedelta(seconds=10),
        description="Time between SIGTERM and the teardown when a sandbox is stopped "
        "(unless its spec.terminationGracePeriodSeconds says otherwise).",
    )
    reap_interval: PositiveDuration = Field(
        default=timedelta(seconds=60),
        description="How often exited containers are torn down and their Sandboxes ended.",
    )
    sync_interval: PositiveDuration = Field(
        default=timedelta(seconds=1),
        description="Window of the sync passes' rate limit: at most sync_burst passes in "
        "any such window. Changes to the node's Sandboxes, its SandboxNode and CachePrune "
        "requests arrive by watch and wake a pass at once while the limit allows; beyond "
        "it, changes share passes.",
    )
    sync_burst: int = Field(
        default=5,
        ge=1,
        le=1000,
        description="Sync passes allowed per sync_interval, back to back after a quiet "
        "time (each as soon as a change arrives); one is earned back every "
        "sync_interval / sync_burst.",
    )
    resync_interval: PositiveDuration = Field(
        default=timedelta(seconds=30),
        description="Longest time between two sync passes when nothing changes: the "
        "full sync re-runs from the watched objects (no API request) against "
        "containerd's containers, and unanswered CachePrune requests are looked at again.",
    )
    watch_timeout: Duration = Field(
        default=timedelta(seconds=30),
        description="Server-side timeout of each watch of the node's Sandboxes, its "
        "SandboxNode and CachePrune requests; the client gives up reading half that "
        "again later, so a watch that died silently is noticed (and the view listed "
        "again) within about 1.6 times this, well below the operator's lease + grace.",
    )
    teardown_concurrency: int = Field(
        default=8, ge=1, le=256, description="Teardowns (and starts) running at once."
    )
    capacity: int = Field(
        default=110, ge=0, description="Non-terminal sandboxes this node accepts."
    )
    capacity_memory: str = Field(
        default="",
        max_length=64,
        description="Sum of the sandboxes' memory limits this node accepts (a quantity); "
        "empty: the node's memory. The agent refuses a sandbox beyond it (OverCapacity).",
    )
    capacity_cpu: str = Field(
        default="",
        max_length=64,
        description="Sum of the sandboxes' CPU limits this node accepts (a quantity); "
        "the agent refuses a sandbox beyond it (OverCapacity). Empty: not bounded (CPU "
        "is compressible; limits may exceed the node's CPUs, as in Kubernetes).",
    )
    capacity_ephemeral_storage: str = Field(
        default="",
        max_length=64,
        description="Sum of the sandboxes' ephemeral-storage limits this node accepts (a "
        "quantity); the agent refuses a sandbox beyond it (OverCapacity). Empty: the "
        "filesystem holding containerd_root below gc_high (what image GC keeps it under).",
    )
    metrics_port: ListenPort = Field(
        default=9090, description="Port of /metrics, /livez and /readyz (0 = off)."
    )
    node_address: str = Field(
        default="",
        description="This node's address, reported in its SandboxNode and as the IP of "
        "its hostNetwork sandboxes (of all of them with network_mode host-address); "
        "default: the host name's address.",
    )
    log_dir: str = Field(
        default="/var/log/sandlot",
        description="Directory of the sandboxes' stdout/stderr files (empty = not kept).",
    )
    state_dir: str = Field(
        default="/var/lib/sandlot",
        min_length=1,
        description="Directory on the node's own disk holding the one-agent-per-node lock "
        "(agent-<node>.lock): a second agent waits there until the first exits.",
    )
    agent_image: str = Field(
        default="", description="The agent's own image: pinned, never collected."
    )
    gc_disabled: bool = Field(default=False, description="Turn image GC off.")
    gc_high: float = Field(
        default=85.0,
        gt=0,
        le=100,
        description="Disk usage (percent) at or above which the automatic pass evicts "
        "images, then the agent evicts sandboxes (docs/isolation.md).",
    )
    gc_low: float = Field(
        default=80.0,
        gt=0,
        le=100,
        description="Disk usage (percent) image GC and sandbox evictions go down to.",
    )
    gc_min_free: int = Field(
        default=0, ge=0, description="Free bytes below which the pass evicts (0 = off)."
    )
    gc_target_free: int = Field(
        default=0, ge=0, description="Free bytes the pass evicts up to (0 = off)."
    )
    gc_min_age: Duration = Field(
        default=timedelta(minutes=2),
        description="Images younger than this (since import or last use) are kept.",
    )
    gc_interval: PositiveDuration = Field(
        default=timedelta(seconds=60), description="Time between automatic passes."
    )
    gc_exhausted_backoff: PositiveDuration = Field(
        default=timedelta(minutes=30),
        description="Automatic passes are skipped this long once one found nothing left "
        "to evict and the disk still over the high mark.",
    )
    pids_limit: int = Field(
        default=1024,
        ge=limits.MIN_PIDS_LIMIT,
        description=f"Most processes and threads of one sandbox, at least {limits.MIN_PIDS_LIMIT}.",
    )
    default_memory_limit: str = Field(
        default="256Mi",
        max_length=64,
        description="Memory limit of a sandbox that sets none, at least "
        f"{MIN_MEMORY_LIMIT} (a namespace's sandlot.dev/default-limits overrides it).",
    )
    default_cpu_limit: str = Field(
        default="1",
        max_length=64,
        description=f"CPU limit of a sandbox that sets none, at least {MIN_CPU_LIMIT} "
        "(a namespace's sandlot.dev/default-limits annotation overrides it).",
    )
    default_ephemeral_storage_limit: str = Field(
        default="4Gi",
        max_length=64,
        description="Ephemeral-storage limit (writable layer and logs) of a sandbox that "
        "sets none and whose namespace's sandlot.dev/default-limits names none: measured, "
        "capped where the filesystem can, and counted in the node's capacity. Empty: such "
        "a sandbox is neither limited nor counted.",
    )
    log_max_bytes: int = Field(
        default=10 * 2**20,
        ge=0,
        description="Most bytes in a sandbox's stdout/stderr file, held as written: it is "
        "then rotated (one previous generation kept); 0: no cap.",
    )
    log_interval: PositiveDuration = Field(
        default=timedelta(seconds=10),
        description="How often old logs are removed, output re-attached and disk use measured.",
    )
    disk_pressure_transition: PositiveDuration = Field(
        default=timedelta(minutes=5),
        description="How long the node reports disk pressure (and refuses new sandboxes) "
        "after its disk was last at or over gcHigh, as the kubelet's "
        "evictionPressureTransitionPeriod.",
    )
    stream_port: ListenPort = Field(
        default=0,
        description="Port of the stream server behind `sandlot logs` and `sandlot exec`: "
        "mutual TLS, reached only by sandlot's stream gateway; 0: off.",
    )
    stream_bind: str = Field(
        default="",
        max_length=253,
        description="Address the stream server listens on (empty: every address). The "
        "gateway reaches it at the agent pod's IP.",
    )
    stream_tls_cert: PemPath = Field(
        default="",
        description="PEM file of the stream server's certificate, issued by sandlot's agent "
        "CA for this node (written by the agent itself with stream_tls_request). Required "
        "with stream_port.",
    )
    stream_tls_key: PemPath = Field(default="", description="PEM file of that certificate's key.")
    stream_tls_request: bool = Field(
        default=False,
        description="Make the stream server's key on this node and ask sandlot's operator "
        "for its certificate (a CertificateSigningRequest of signer sandlot.dev/agent-serving, "
        "naming this node alone), writing both to stream_tls_cert and stream_tls_key; renewed "
        "at two thirds of its lifetime. Off: those files are used as they are.",
    )
    stream_tls_request_timeout: PositiveDuration = Field(
        default=timedelta(minutes=2),
        description="How long the agent waits for its stream certificate request to be "
        "answered before its start fails (and the pod is restarted).",
    )
    stream_client_ca: PemPath = Field(
        default="",
        description="PEM file of the CA whose client certificates the stream server "
        "accepts: the stream gateway's own CA, which issues nothing else (not the agents' "
        "CA, not a cluster-wide issuer). Required with stream_port.",
    )
    stream_client_name: list[str] = Field(
        default_factory=lambda: ["sandlot-gateway"],
        description="Common names of the client certificates the stream server accepts: "
        "the stream gateway's (repeatable). Any other certificate of the CA is refused.",
    )
    stream_file_max_bytes: int = Field(
        default=256 * 2**20, ge=1, description="Most bytes one file read or write moves."
    )
    stream_max_sessions: int = Field(
        default=512,
        ge=1,
        le=65536,
        description="Streams open at once on this node, whatever the gateways let through "
        "(each caps its own users): past it, a 429 naming the node, not a thread per caller.",
    )
    idle_interval: PositiveDuration = Field(
        default=timedelta(seconds=10),
        description="How often sandboxes with spec.idleTimeoutSeconds are sampled (their "
        "sessions and CPU) for an idle pause.",
    )
    idle_cpu_cores: float = Field(
        default=0.01,
        ge=0,
        le=64,
        description="CPU (in cores, averaged between two samples) below which a sandbox "
        "without a stream session counts as idle.",
    )
    paused_streams: Literal["Refuse", "Resume"] = Field(
        default="Refuse",
        description="An exec, files call or port-forward into a sandbox whose "
        "spec.operatingMode is Paused: Refuse (409 naming spec.operatingMode) or Resume "
        "(thawed for the stream, frozen again when its streams end). A sandbox paused for "
        "being idle is always resumed.",
    )
    stream_idle_timeout: PositiveDuration = Field(
        default=timedelta(minutes=10),
        description="An exec, log follow, file write or port-forward with no data this long ends.",
    )
    proc_root: str = Field(
        default="/proc",
        max_length=256,
        description="The node's /proc, where containerd's task pids live (in a pod, the "
        "host's /proc mounted in). tcpSocket and httpGet probes of a sandbox without a "
        "namespace made by the agent enter its task's network through it, once the pid "
        "there is shown to be the task (its cgroup); else they run the image's nc or "
        "wget inside.",
    )
    files_tool: str = Field(
        default="",
        pattern=r"^(/.*)?$",
        max_length=256,
        description="The static files tool (operator/filetool) in the agent's image. The "
        "agent copies it to state_dir/bin and mounts it read-only into every sandbox of "
        "a handler with a host view, where sandlot cp and port-forward run it as the "
        "sandbox's user with no capabilities. Empty: none; they run the image's own "
        "tools (sh, cat, nc ...) instead.",
    )
    executor: str = Field(
        default="",
        pattern=r"^(/.*)?$",
        max_length=256,
        description="The static executor (operator/executor) in the agent's image. The "
        "agent copies it to state_dir/bin and mounts it read-only beside the files tool; "
        "started once per sandbox as its user, it forks each sandlot exec command there "
        "instead of a runtime exec per command. Empty: every command is a runtime exec.",
    )
    cgroup_parent: str = Field(
        default="/sandlot",
        pattern=r"^/[A-Za-z0-9._/-]*$",
        max_length=256,
        description="Parent cgroup of every sandbox's cgroup. Reserve it from the kubelet "
        "(systemReserved/kubeReserved, or a slice it does not manage) so the kubelet "
        "accounts the sandboxes and never evicts the agent for their usage.",
    )
    cgroup_parent_memory_reserve: Quantity = Field(
        default="1Gi",
        description="Memory the parent cgroup of all sandboxes leaves to the node's own "
        "services: its hard limit is the node's memory minus this (its pids limit is "
        f"pid_max minus {limits.PIDS_RESERVE}), so no sum of sandboxes can OOM them.",
    )
    apparmor_profile: str = Field(
        default="cri-containerd.apparmor.d",
        max_length=256,
        description="AppArmor profile of every unprivileged sandbox on a node whose "
        "kernel has AppArmor enabled (containerd's CRI default profile name); a sandbox "
        "fails to start when it is not loaded. Empty: no profile.",
    )
    default_policy_level: Level = Field(
        default=Level.BASELINE,
        description="Policy level (privileged, baseline, restricted) of a namespace "
        "without the sandlot.dev/enforce label; keep it equal to the admission "
        "policy's (Helm: admissionPolicy.defaultLevel).",
    )
    cgroup_root: str = Field(
        default="/sys/fs/cgroup",
        min_length=1,
        description="Where the node's cgroup filesystem is mounted in the agent (the "
        "host's, v1 or v2): read to tell an out-of-memory kill from other exits.",
    )
    pinned_image: list[str] = Field(
        default_factory=list, description="Images never collected (repeatable)."
    )
    live_job_prefix: list[str] = Field(
        default_factory=list,
        description="Image-name prefixes of live jobs, never collected (repeatable).",
    )

    @field_validator("preloaded_images_verification_allowlist")
    @classmethod
    def _allowlist(cls, value: list[str]) -> list[str]:
        return check_allowlist(value)

    @model_validator(mode="after")
    def _check(self) -> AgentSettings:
        if not timedelta(seconds=1) <= self.watch_timeout <= timedelta(seconds=120):
            raise ValueError(
                f"watch_timeout ({self.watch_timeout.total_seconds():g}s) must be between "
                "1s and 120s: a dead watch must be noticed well before a node is reaped"
            )
        if self.stop_grace < timedelta(0):
            raise ValueError("stop_grace must be >= 0")
        if self.gc_min_age < timedelta(0):
            raise ValueError("gc_min_age must be >= 0")
        if self.renew_interval >= self.lease_duration:
            raise ValueError(
                f"renew_interval ({self.renew_interval.total_seconds():g}s) must be below "
                f"lease_duration ({self.lease_duration.total_seconds():g}s)"
            )
        if self.resync_interval < self.sync_interval:
            raise ValueError(
                f"resync_interval ({self.resync_interval.total_seconds():g}s) must be at "
                f"least sync_interval ({self.sync_interval.total_seconds():g}s)"
            )
        if self.lease_duration.total_seconds() < 1:
            raise ValueError("lease_duration must be at least 1s (the Lease counts seconds)")
        if self.gc_low >= self.gc_high:
            raise ValueError(f"gc_low ({self.gc_low}) must be below gc_high ({self.gc_high})")
        if self.gc_target_free and self.gc_target_free < self.gc_min_free:
            raise ValueError(
                f"gc_target_free ({self.gc_target_free}) must be >= gc_min_free "
                f"({self.gc_min_free}) or 0 (off)"
            )
        for name in ("capacity_memory", "capacity_cpu", "capacity_ephemeral_storage"):
            value = getattr(self, name)
            if value and parse_quantity(value) <= 0:
                raise ValueError(f"{name} ({value}) must be a positive quantity or empty")
        refusal = limits.defaults_refusal(self.default_memory_limit, self.default_cpu_limit)
        if refusal:
            raise ValueError(refusal)
        storage = self.default_ephemeral_storage_limit
        if storage and (
            refusal := limits.storage_floor_refusal(storage, "default_ephemeral_storage_limit")
        ):
            raise ValueError(refusal)
        if self.stream_port and not (
            self.stream_tls_cert and self.stream_tls_key and self.stream_client_ca
        ):
            raise ValueError(
                "stream_port needs stream_tls_cert, stream_tls_key and stream_client_ca: "
                "the stream server speaks only mutual TLS"
            )
        for name in ("blocked_egress", "cluster_cidrs", "allowed_egress"):
            parse_cidr_list(getattr(self, name), name)
        if any(not 1 <= p <= 65535 for p in self.reserved_ports):
            raise ValueError(f"reserved_ports ({self.reserved_ports}) must be ports 1-65535")
        if self.stream_port and not self.stream_client_name:
            raise ValueError("stream_client_name must name at least one client certificate")
        return self

    @property
    def default_limits(self) -> limits.DefaultLimits:
        """The limits of a sandbox that sets none, before its namespace's say."""
        return limits.DefaultLimits(
            self.default_memory_limit,
            self.default_cpu_limit,
            self.pids_limit,
            self.default_ephemeral_storage_limit,
        )

    @property
    def network_default(self) -> ClusterDefault:
        return ClusterDefault(
            blocked=tuple(self.blocked_egress),
            cluster_ranges=tuple(self.cluster_cidrs),
            allowed_egress=tuple(self.allowed_egress),
        )

    @property
    def node_ports(self) -> frozenset[int]:
        """Ports the node serves: the reserved ones and the agent's own."""
        own = (self.metrics_port, self.stream_port)
        return frozenset(self.reserved_ports) | {p for p in own if p}

    @property
    def gc_thresholds(self) -> GcThresholds:
        return GcThresholds(
            high_percent=self.gc_high,
            low_percent=self.gc_low,
            min_free_bytes=self.gc_min_free,
            target_free_bytes=self.gc_target_free,
            min_age=self.gc_min_age,
            interval=self.gc_interval,
            exhausted_backoff=self.gc_exhausted_backoff,
        )

    @property
    def sync_pacing(self) -> Pacing:
        return Pacing(
            interval=self.sync_interval.total_seconds() / self.sync_burst,
            burst=self.sync_burst,
            longest=self.resync_interval.total_seconds(),
        )

    @property
    def pinned_images(self) -> tuple[str, ...]:
        return tuple(p for p in (*self.pinned_image, self.agent_image) if p)

    @property
    def teardown_bound(self) -> float:
        """Seconds one teardown can take at most: the exit wait plus four call deadlines."""
        return self.kill_wait.total_seconds() + 4 * self.call_timeout.total_seconds()
