"""A real Kubernetes control plane (etcd + kube-apiserver, and optionally
kube-controller-manager's garbage collector and namespace controller) on
loopback, for tests and ``sandlot dev up``.

It follows envtest's recipe: binaries from ``KUBEBUILDER_ASSETS`` when a user has
them, otherwise built from their Go modules once and cached by version; free
loopback ports; RBAC authorization on; a generated service-account signing key so
real ServiceAccount tokens work; an admin identity (static token, group
``system:masters``) written into a kubeconfig. Every wait has a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from sandlot.devtools.certs import front_proxy_flags
from sandlot.devtools.processes import run_bounded, terminate

BUILD_SCRIPT = Path(__file__).with_name("build-control-plane.sh")
HELM_BUILD_SCRIPT = Path(__file__).with_name("build-helm.sh")
GOTOOL_BUILD_SCRIPT = Path(__file__).with_name("build-gotool.sh")
KCM_BUILD_SCRIPT = Path(__file__).with_name("build-controller-manager.sh")
# What a local cluster needs of kube-controller-manager: ownerReference garbage
# collection and namespace deletion (pools' sandboxes, a namespace's objects).
KCM_CONTROLLERS = "garbagecollector,namespace"
HELM_VERSION = os.environ.get("HELM_VERSION", "3.22.0")
KUBE_VERSION = os.environ.get("KUBE_VERSION", "1.36.3")
ETCD_VERSION = os.environ.get("ETCD_VERSION", "3.6.16")
ADMIN_USER = "sandlot-admin"


class ControlPlaneError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def binaries_dir(build_timeout: float = 3000.0) -> Path:
    """Directory holding kube-apiserver, etcd and kubectl.

    ``KUBEBUILDER_ASSETS`` wins when it holds kube-apiserver and etcd (kubectl is
    then taken from there or from the build cache). Otherwise the binaries are
    built (or found already built) by ``build-control-plane.sh``.
    """
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets and (Path(assets) / "kube-apiserver").exists() and (Path(assets) / "etcd").exists():
        return Path(assets)
    return _run_build(
        BUILD_SCRIPT,
        "the control-plane binaries",
        build_timeout,
        KUBE_VERSION=KUBE_VERSION,
        ETCD_VERSION=ETCD_VERSION,
    )


def _run_build(script: Path, what: str, timeout: float, **env: str) -> Path:
    """Run a build script (it prints the directory or binary it produced, cached by
    version), bounded by ``timeout``; a failure raises with the script's stderr."""
    proc = run_bounded(
        ["bash", str(script)],
        f"building {what}",
        timeout,
        error=ControlPlaneError,
        tail=4000,
        env=dict(os.environ, **env),
    )
    return Path(proc.stdout.strip().splitlines()[-1])


def controller_manager_path(build_timeout: float = 3000.0) -> Path:
    """kube-controller-manager: from ``KUBEBUILDER_ASSETS`` when it holds one, else
    built once from the same Kubernetes module and release as kube-apiserver."""
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets and (Path(assets) / "kube-controller-manager").exists():
        return Path(assets) / "kube-controller-manager"
    return _run_build(
        KCM_BUILD_SCRIPT,
        "kube-controller-manager",
        build_timeout,
        KUBE_VERSION=KUBE_VERSION,
        ETCD_VERSION=ETCD_VERSION,
    )


def kubectl_path() -> Path:
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets and (Path(assets) / "kubectl").exists():
        return Path(assets) / "kubectl"
    return binaries_dir() / "kubectl"


def helm_path(build_timeout: float = 1800.0) -> Path:
    """The helm binary: ``$HELM`` when set, else built from its Go module once
    (``build-helm.sh``) and cached by version."""
    if os.environ.get("HELM"):
        return Path(os.environ["HELM"])
    return _run_build(HELM_BUILD_SCRIPT, "helm", build_timeout, HELM_VERSION=HELM_VERSION)


def files_tool_path(build_timeout: float = 600.0) -> Path:
    """The agent's files tool (``operator/filetool``), built with this machine's Go
    once per source (``build-gotool.sh``)."""
    return _run_build(
        GOTOOL_BUILD_SCRIPT,
        "the files tool",
        build_timeout,
        SANDLOT_GOTOOL="filetool",
        SANDLOT_GOTOOL_BINARY="sandlot-files",
    )


def executor_path(build_timeout: float = 600.0) -> Path:
    """The agent's command executor (``operator/executor``), built with this
    machine's Go once per source (``build-gotool.sh``)."""
    return _run_build(
        GOTOOL_BUILD_SCRIPT,
        "the executor",
        build_timeout,
        SANDLOT_GOTOOL="executor",
        SANDLOT_GOTOOL_BINARY="sandlot-exec",
    )


ETCD_DATA = "etcd"  # etcd's data directory, under the workdir


@dataclass
class ControlPlane:
    """etcd + kube-apiserver under ``workdir``; ``start()``/``stop()`` or a context manager."""

    workdir: Path
    bin_dir: Path | None = None
    start_timeout: float = 90.0
    extra_apiserver_flags: list[str] = field(default_factory=list)
    # Added to kube-apiserver's environment (e.g. GODEBUG=gctrace=1 for a benchmark).
    apiserver_env: dict[str, str] = field(default_factory=dict)
    controller_manager: bool = False
    # A cluster with kubelets serves on an address its nodes reach (``address``) and
    # runs more of kube-controller-manager (``kcm_controllers``, ``extra_kcm_flags``).
    address: str = "127.0.0.1"
    authorization_mode: str = "RBAC"
    disabled_admission_plugins: str = "ServiceAccount"
    kcm_controllers: str = KCM_CONTROLLERS
    extra_kcm_flags: list[str] = field(default_factory=list)
    etcd_port: int = 0
    apiserver_port: int = 0
    etcd_peer_port: int = 0
    admin_token: str = ""
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)

    @property
    def url(self) -> str:
        return f"https://{self.address}:{self.apiserver_port}"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def ca_file(self) -> Path:
        return self.workdir / "certs" / "apiserver.crt"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    # -- lifecycle -----------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, detach: bool = False) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.bin_dir is None:
            self.bin_dir = binaries_dir()
        self._write_auth()
        try:
            self.start_etcd(detach)
            self._start_apiserver(detach)
            self.wait_ready()
            self._write_kubeconfig()
            if self.controller_manager:
                self._start_controller_manager(detach)
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 15.0) -> None:
        for name in ("kube-controller-manager", "kube-apiserver", "etcd"):
            proc = self._procs.pop(name, None)
            if proc is not None:
                terminate(proc, timeout)

    def stop_apiserver(self, timeout: float = 15.0) -> None:
        """Stop kube-apiserver only (fault tests); ``restart_apiserver`` brings it back."""
        proc = self._procs.pop("kube-apiserver", None)
        if proc is not None:
            terminate(proc, timeout)

    def restart_apiserver(self) -> None:
        self._start_apiserver(detach=False)
        self.wait_ready()

    def restart_etcd(self) -> None:
        """etcd started again, once the API server says it is ready on it (its etcd
        client reconnects on its own; until then its requests time out)."""
        self.start_etcd()
        self.wait_ready()

    def stop_etcd(self, timeout: float = 15.0) -> None:
        proc = self._procs.pop("etcd", None)
        if proc is not None:
            terminate(proc, timeout)

    def start_etcd(self, detach: bool = False) -> None:
        if not self.etcd_port:
            self.etcd_port = free_port()
        if not self.etcd_peer_port:
            self.etcd_peer_port = free_port()
        peer = self.etcd_peer_port
        assert self.bin_dir is not None
        self._spawn(
            "etcd",
            [
                str(self.bin_dir / "etcd"),
                "--name=sandlot-test",
                f"--data-dir={self.workdir / ETCD_DATA}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=sandlot-test=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
            detach,
        )

    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self._procs.items()}

    # -- internals -------------------------------------------------------------

    def _write_auth(self) -> None:
        certs = self.workdir / "certs"
        certs.mkdir(exist_ok=True)
        key = certs / "sa.key"
        if not key.exists():
            _run(["openssl", "genrsa", "-out", str(key), "2048"])
            _run(["openssl", "rsa", "-in", str(key), "-pubout", "-out", str(certs / "sa.pub")])
        tokens = self.workdir / "tokens.csv"
        if not tokens.exists():
            token = os.urandom(24).hex()
            tokens.write_text(f'{token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
            tokens.chmod(0o600)
        self.admin_token = tokens.read_text().split(",", 1)[0]

    def _start_apiserver(self, detach: bool) -> None:
        if not self.apiserver_port:
            self.apiserver_port = free_port()
        certs = self.workdir / "certs"
        assert self.bin_dir is not None
        self._spawn(
            "kube-apiserver",
            [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers={self.etcd_url}",
                f"--cert-dir={certs}",
                f"--bind-address={self.address}",
                f"--advertise-address={self.address}",
                f"--secure-port={self.apiserver_port}",
                f"--authorization-mode={self.authorization_mode}",
                f"--token-auth-file={self.workdir / 'tokens.csv'}",
                f"--service-account-key-file={certs / 'sa.pub'}",
                f"--service-account-signing-key-file={certs / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--allow-privileged=true",
                f"--disable-admission-plugins={self.disabled_admission_plugins}",
                "--enable-priority-and-fairness=false",
                *front_proxy_flags(certs),
                "--v=0",
                *self.extra_apiserver_flags,
            ],
            detach,
            env=self.apiserver_env,
        )

    def _start_controller_manager(self, detach: bool) -> None:
        binary = controller_manager_path()
        self._spawn(
            "kube-controller-manager",
            [
                str(binary),
                f"--kubeconfig={self.kubeconfig}",
                f"--controllers={self.kcm_controllers}",
                "--leader-elect=false",
                "--secure-port=0",
                "--concurrent-gc-syncs=5",
                "--v=0",
                *self.extra_kcm_flags,
            ],
            detach,
        )

    def _spawn(
        self, name: str, argv: list[str], detach: bool, env: dict[str, str] | None = None
    ) -> None:
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        self._procs[name] = subprocess.Popen(
            argv,
            env=dict(os.environ, **env) if env else None,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=detach,
        )
        log.close()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        last = "no answer yet"
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # the serving cert is generated at start
        while time.monotonic() < deadline:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise ControlPlaneError(
                        f"{name} exited with {proc.returncode} during start-up; "
                        f"see {self.workdir / (name + '.log')}:\n{_tail(self.workdir / (name + '.log'))}"
                    )
            req = urllib.request.Request(
                f"{self.url}/readyz", headers={"Authorization": f"Bearer {self.admin_token}"}
            )
            try:
                with urllib.request.urlopen(req, context=ctx, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError) as e:
                last = str(e)
            time.sleep(0.2)
        raise ControlPlaneError(
            f"kube-apiserver not ready within {self.start_timeout:.0f}s ({last}); "
            f"see {self.workdir / 'kube-apiserver.log'}:\n{_tail(self.workdir / 'kube-apiserver.log')}"
        )

    def _write_kubeconfig(self) -> None:
        self.kubeconfig.write_text(
            yaml.safe_dump(
                kubeconfig_dict(self.url, str(self.ca_file), ADMIN_USER, token=self.admin_token)
            )
        )

    def state(self) -> dict[str, object]:
        return {
            "workdir": str(self.workdir),
            "etcd_port": self.etcd_port,
            "apiserver_port": self.apiserver_port,
            "pids": self.pids(),
        }


def kubeconfig_dict(server: str, ca_file: str, user: str, *, token: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "sandlot", "cluster": {"server": server, "certificate-authority": ca_file}}
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "sandlot", "context": {"cluster": "sandlot", "user": user}}],
        "current-context": "sandlot",
    }


def stop_detached(workdir: Path, timeout: float = 15.0) -> list[str]:
    """Stop a control plane started with ``start(detach=True)`` from its state file."""
    state_file = workdir / "state.json"
    if not state_file.exists():
        return []
    state = json.loads(state_file.read_text())
    stopped = []
    for name, pid in state.get("pids", {}).items():
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:  # not a group leader (started attached): the process
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.1)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        stopped.append(name)
    state_file.unlink()
    return stopped


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of ours still answers kill(0); reap it if it is ours.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return Path(f"/proc/{pid}").exists() and "zombie" not in _proc_state(pid)


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:", 1)[1].split("\n", 1)[0]
    except (OSError, IndexError):
        return "zombie"


def _run(argv: list[str]) -> None:
    if shutil.which(argv[0]) is None:
        raise ControlPlaneError(f"'{argv[0]}' is needed to start the control plane and is missing")
    subprocess.run(argv, check=True, capture_output=True, timeout=60)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
