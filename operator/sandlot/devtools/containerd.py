"""A private containerd (tests, benchmarks and the local demo), and the shim
faults tests inject into it.

Two release lines run: 1.6 from the OS package (``containerd`` on PATH) and 2.x,
built from its Go module by ``controlplane/build-containerd.sh`` into the cache
directory (with its own runc v2 shim and ``ctr``; runc is the OS package's). Each
instance has its own root, state, gRPC and ttrpc sockets under a temporary
directory (CRI disabled), so tests never touch a node's containerd. Stopping it
also removes what containerd itself would leave behind when stopped: shims of
this instance (and their containers), and mounts under its directory.

A wedged shim is simulated with SIGSTOP on the container's
``containerd-shim-runc-v2``: calls about its task then hang, which is the fault
the agent's deadlines exist for (SIGKILL would not do: containerd notices a dead
shim and cleans up by itself).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandlot.devtools.processes import terminate
from sandlot.policy.ocispec import default_spec

SHIM_BINARY = "containerd-shim-runc-v2"
REQUIRED_BINARIES = ("containerd", "ctr", "runc", SHIM_BINARY)
NAMESPACE = "sandlot-test"
CRUN_HANDLER = "crun"
RUNC_RUNTIME_TYPE = "io.containerd.runc.v2"
HYBRID_V2_MOUNT = "/sys/fs/cgroup/unified"

SCRATCH_CGROUP_PARENT = "/sandlot-scratch"


def scratch_cgroup(name: str) -> str:
    """A cgroup path of its own for a container a test or benchmark runs directly:
    every containerd on the host shares one cgroup tree, the same test runs beside
    itself against each containerd version, and runc refuses to create a task in a
    cgroup another container has frozen."""
    return f"{SCRATCH_CGROUP_PARENT}/{name}-{uuid.uuid4().hex[:8]}"


def scratch_spec(args: list[str], name: str, *, host_network: bool) -> dict[str, Any]:
    """``default_spec`` of ``args`` for a container named ``name`` run directly: no
    environment, ``/`` as its working directory, a cgroup of its own."""
    return default_spec(
        args, [], "/", host_network=host_network, hostname=name, cgroups_path=scratch_cgroup(name)
    )


LINE_OS = "1.6"
"""The release line of the OS package: binaries from PATH."""
LINE_2 = "2"
"""containerd 2.x, built from its module and cached (``build-containerd.sh``)."""
LINES = (LINE_OS, LINE_2)
CONTAINERD2_VERSION = os.environ.get("CONTAINERD2_VERSION", "2.4.2")
_CACHE_BINARIES = ("containerd", "ctr", SHIM_BINARY)
GVISOR_VERSION = os.environ.get("GVISOR_VERSION", "v0.0.0-20260905035102-160fafc42237")
GVISOR_HANDLER = "gvisor"
RUNSC_SHIM = "containerd-shim-runsc-v1"
SHIM_BINARIES = (SHIM_BINARY, RUNSC_SHIM)


def _cache_dir() -> Path:
    return Path(
        os.environ.get("SANDLOT_CACHE_DIR")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sandlot"
    )


def containerd2_bin_dir() -> Path:
    """Where ``build-containerd.sh`` installs containerd 2.x (same cache rules)."""
    return _cache_dir() / "containerd" / f"v{CONTAINERD2_VERSION}" / "bin"


def gvisor_bin_dir() -> Path | None:
    """Where ``build-gvisor.sh`` installed runsc and its shim; None when not built."""
    found = _cache_dir() / "gvisor" / GVISOR_VERSION / "bin"
    return found if all((found / b).is_file() for b in ("runsc", RUNSC_SHIM)) else None


def bin_dir_for(line: str) -> Path | None:
    """The directory of ``line``'s binaries, or None for those on PATH."""
    if line not in LINES:
        raise ValueError(f"unknown containerd line {line!r} (known: {', '.join(LINES)})")
    return containerd2_bin_dir() if line == LINE_2 else None


def unavailable_reason(line: str = LINE_OS) -> str | None:
    """Why a private containerd of ``line`` cannot run here, or None if it can."""
    if os.geteuid() != 0:
        return "containerd tests need root (running containers)"
    bin_dir = bin_dir_for(line)
    if bin_dir is not None:
        absent = [b for b in _CACHE_BINARIES if not (bin_dir / b).is_file()]
        if absent:
            return (
                f"containerd {CONTAINERD2_VERSION} is not built in {bin_dir} "
                "(make setup builds it: operator/sandlot/devtools/controlplane/"
                "build-containerd.sh)"
            )
        return None if shutil.which("runc") else "containerd tests need runc on PATH"
    missing = [b for b in REQUIRED_BINARIES if shutil.which(b) is None]
    if missing:
        return f"containerd tests need {', '.join(missing)} on PATH"
    return None


def cgroups_hybrid() -> bool:
    """cgroup v1 controllers with the v2 hierarchy mounted beside them
    (``/sys/fs/cgroup/unified``): systemd's hybrid mode, which crun 1.8 refuses."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return False
    types = {fields[1]: fields[2] for fields in (m.split() for m in mounts) if len(fields) > 2}
    return types.get("/sys/fs/cgroup") != "cgroup2" and types.get(HYBRID_V2_MOUNT) == "cgroup2"


def write_crun_wrapper(directory: Path, crun: str) -> Path:
    """A ``crun`` that runs in a mount namespace of its own without the v2 mount, so
    crun 1.8 sees plain cgroup v1 (docs/isolation.md, "Runtime handlers")."""
    wrapper = directory / "crun"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"exec unshare --mount --propagation private /bin/sh -c "
        f'\'umount {HYBRID_V2_MOUNT} 2>/dev/null; exec {crun} "$@"\' crun "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _flag(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv[:-1]):
        if arg in (f"-{name}", f"--{name}"):
            return argv[i + 1]
    for arg in argv:
        for prefix in (f"-{name}=", f"--{name}="):
            if arg.startswith(prefix):
                return arg[len(prefix) :]
    return None


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: fields resume after the last ')'.
    return int(stat.rsplit(")", 1)[1].split()[1])


def shim_pids(address: str, binaries: tuple[str, ...] = (SHIM_BINARY,)) -> list[int]:
    """PIDs of shims (runc v2's unless ``binaries`` says) serving the containerd at
    ``address``."""
    found = []
    for pid in _pids():
        argv = _cmdline(pid)
        if argv and os.path.basename(argv[0]) in binaries and _flag(argv, "address") == address:
            found.append(pid)
    return found


def find_shim_pid(address: str, container_id: str, task_pid: int | None = None) -> int:
    """The shim of ``container_id``: by its ``-id`` (ungrouped shims), else the task's parent."""
    shims = shim_pids(address, SHIM_BINARIES)
    for pid in shims:
        if _flag(_cmdline(pid), "id") == container_id:
            return pid
    if task_pid is not None:
        parent = _ppid(task_pid)
        if parent is not None and parent in shims:
            return parent
    raise LookupError(f"no {SHIM_BINARY} for container {container_id} of containerd {address}")


@contextlib.contextmanager
def stopped_process(pid: int) -> Iterator[int]:
    """SIGSTOP ``pid`` for the duration of the block, SIGCONT after (whatever happens)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def all_threads_stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped: SIGSTOP takes hold of a busy
    multi-threaded process a moment after it is sent."""
    states = [
        stat.read_text().rsplit(")", 1)[1].split()[0]
        for stat in Path(f"/proc/{pid}/task").glob("*/stat")
    ]
    return bool(states) and all(state in ("T", "t") for state in states)


def _descendants(roots: list[int]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid in _pids():
        parent = _ppid(pid)
        if parent is not None:
            children.setdefault(parent, []).append(pid)
    out: list[int] = []
    stack = list(roots)
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(children.get(pid, ()))
    return out


def _unmount_under(directory: Path) -> None:
    prefix = str(directory.resolve()) + "/"
    points = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].replace("\\040", " ")
            if point.startswith(prefix):
                points.append(point)
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, timeout=10, check=False)


@dataclass
class PrivateContainerd:
    """A running private containerd; ``stop()`` (or the context manager) ends it."""

    root_dir: Path
    process: subprocess.Popen[bytes] | None = None
    namespace: str = NAMESPACE
    line: str = LINE_OS
    path_prefix: Path | None = None
    """A directory put first on containerd's PATH (and so its shims'): a ``runc``
    there is the one the shims run (a wrapper injecting a fault, say)."""
    _log: object = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return str(self.root_dir / "containerd.sock")

    @property
    def root(self) -> Path:
        return self.root_dir / "root"

    @property
    def state(self) -> Path:
        return self.root_dir / "state"

    @property
    def config_path(self) -> Path:
        """Its configuration, as the agent's ``containerd_config`` reads a node's."""
        return self.root_dir / "config.toml"

    @property
    def log_path(self) -> Path:
        return self.root_dir / "containerd.log"

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    @property
    def bin_dir(self) -> Path | None:
        return bin_dir_for(self.line)

    @property
    def ctr(self) -> str:
        """The ``ctr`` of this instance's release line."""
        return str(self.bin_dir / "ctr") if self.bin_dir is not None else "ctr"

    def _environment(self) -> dict[str, str]:
        # containerd finds its shim on PATH: 2.x's own shim goes first.
        env = dict(os.environ)
        if self.bin_dir is not None:
            env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        if self.path_prefix is not None:
            env["PATH"] = f"{self.path_prefix}{os.pathsep}{env.get('PATH', '')}"
        return env

    def _gvisor(self) -> Path | None:
        """gVisor's binaries when this instance declares it: 2.x only (its shim speaks
        the shim protocol of containerd 2), and only once built."""
        return gvisor_bin_dir() if self.line == LINE_2 else None

    def write_config(self) -> Path:
        # 2.x reads config version 3, where the CRI plugin is split in three.
        version, cri = (
            (
                "3",
                '"io.containerd.grpc.v1.cri", "io.containerd.cri.v1.images", '
                '"io.containerd.cri.v1.runtime"',
            )
            if self.line == LINE_2
            else ("2", '"io.containerd.grpc.v1.cri"')
        )
        config = self.config_path
        config.write_text(
            "\n".join(
                [
                    f"version = {version}",
                    f'root = "{self.root}"',
                    f'state = "{self.state}"',
                    f"disabled_plugins = [{cri}]",
                    "",
                    "[grpc]",
                    f'  address = "{self.address}"',
                    "",
                    "[ttrpc]",
                    f'  address = "{self.root_dir / "containerd-ttrpc.sock"}"',
                    "",
                    *self._runtime_handlers(),
                ]
            )
        )
        return config

    def _runtime_handlers(self) -> list[str]:
        """The CRI runtimes section declaring ``crun`` (when installed) as a handler run
        by the runc shim, and ``gvisor`` (when built, 2.x only) by its own shim, the way
        a node's containerd declares them. CRI itself stays disabled: the agent reads
        this section to know its handlers."""
        plugin = (
            "io.containerd.cri.v1.runtime" if self.line == LINE_2 else "io.containerd.grpc.v1.cri"
        )
        lines: list[str] = []
        crun = shutil.which("crun")
        if crun is not None:
            binary = write_crun_wrapper(self.root_dir, crun) if cgroups_hybrid() else crun
            table = f'plugins."{plugin}".containerd.runtimes.{CRUN_HANDLER}'
            lines += [
                f"[{table}]",
                f'  runtime_type = "{RUNC_RUNTIME_TYPE}"',
                f"[{table}.options]",
                f'  BinaryName = "{binary}"',
                "",
            ]
        gvisor = self._gvisor()
        if gvisor is not None:
            # runsc is not on containerd's PATH: the shim finds it through its options
            # file (ConfigPath), which the agent hands it as CRI would.
            runsc_toml = self.root_dir / "runsc.toml"
            runsc_toml.write_text(f'binary_name = "{gvisor / "runsc"}"\n')
            table = f'plugins."{plugin}".containerd.runtimes.{GVISOR_HANDLER}'
            lines += [
                f"[{table}]",
                '  runtime_type = "io.containerd.runsc.v1"',
                f'  runtime_path = "{gvisor / RUNSC_SHIM}"',
                f"[{table}.options]",
                '  TypeUrl = "io.containerd.runsc.v1.options"',
                f'  ConfigPath = "{runsc_toml}"',
                "",
            ]
        return lines

    def start(self, *, ready_timeout: float = 20.0) -> None:
        config = self.write_config()
        log = self.log_path.open("wb")
        self._log = log
        binary = str(self.bin_dir / "containerd") if self.bin_dir is not None else "containerd"
        self.process = subprocess.Popen(
            [binary, "--config", str(config), "--log-level", "info"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=self._environment(),
        )
        self._wait_ready(ready_timeout)

    def _wait_ready(self, timeout: float) -> None:
        from sandlot.adapters.containerd import ContainerdRuntime
        from sandlot.adapters.runtime import RuntimeError_

        deadline = time.monotonic() + timeout
        last_error = "socket never appeared"
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"containerd exited with {self.process.returncode} while starting:\n"
                    + self.log_tail()
                )
            if Path(self.address).exists():
                runtime = ContainerdRuntime(self.address, self.namespace)
                try:
                    runtime.version(timeout=2.0)
                    return
                except RuntimeError_ as exc:
                    last_error = str(exc)
                finally:
                    runtime.close()
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(
            f"containerd at {self.address} not ready within {timeout:g}s ({last_error}):\n"
            + self.log_tail()
        )

    def stop(self, *, grace: float = 10.0) -> None:
        """Stop containerd, then its shims and their containers, then clean its directory."""
        if self.process is not None:
            terminate(self.process, grace)
        shims = shim_pids(self.address, SHIM_BINARIES)
        for pid in _descendants(shims):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + grace
        while shim_pids(self.address, SHIM_BINARIES) and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._log is not None:
            self._log.close()  # type: ignore[attr-defined]
            self._log = None
        _unmount_under(self.root_dir)

    def restart(self, *, grace: float = 10.0) -> None:
        """Restart the containerd process only, as a package upgrade does: shims and
        their containers keep running and the new containerd reconnects to them."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=grace)
        if self._log is not None:
            self._log.close()  # type: ignore[attr-defined]
            self._log = None
        self.start()

    def remove(self) -> None:
        _unmount_under(self.root_dir)
        shutil.rmtree(self.root_dir, ignore_errors=True)

    def __enter__(self) -> PrivateContainerd:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
        self.remove()


def start_private_containerd(
    base: Path | None = None, line: str = LINE_OS, *, path_prefix: Path | None = None
) -> PrivateContainerd:
    """Start a private containerd of release ``line`` under a new directory (short:
    socket paths are limited); ``path_prefix`` goes first on its PATH."""
    bin_dir_for(line)  # refuses an unknown line before anything is created
    root_dir = Path(tempfile.mkdtemp(prefix="sl-ctrd-", dir=base))
    # Searchable by every user, as containerd's own /run/containerd: a user-namespaced
    # container's runc sets up its root filesystem as the namespace's (unprivileged) root.
    root_dir.chmod(0o711)
    instance = PrivateContainerd(root_dir, line=line, path_prefix=path_prefix)
    try:
        instance.start()
    except BaseException:
        instance.stop()
        instance.remove()
        raise
    return instance
