"""The images the local cluster runs, built here and cached by a hash of their
inputs (a warm run rebuilds nothing; nothing is ever pulled by a node):

- the pause image: a few lines of C, ``gcc -static``;
- the sandlot image, from the Dockerfile's recipe without a Docker engine
  (``RECIPE``): a Debian rootfs from ``debootstrap`` with the same packages and the
  same user (layer 1), and ``/opt/sandlot``, a virtualenv with the dependencies
  installed by pip from ``requirements/runtime.txt`` (the runtime lock, its hashes
  checked) and then the package alone, ``--no-deps``, and the files tool built with
  this machine's Go (layer 2); entrypoint, command,
  environment and user as the Dockerfile says.
  tests/unit/test_image_recipe.py keeps the Dockerfile and ``RECIPE`` in step;
- the runtimes image (the chart's agent.runtimes installers): a static busybox and
  gVisor's ``runsc`` and shim under ``/gvisor/bin``, as ``build-gvisor.sh`` built
  them. Apart from the sandlot image, which stays without them: only the nodes that
  install gVisor fetch its ~110 MB (~40 MB compressed).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sandlot.devtools.controlplane import executor_path, files_tool_path
from sandlot.devtools.ociarchive import build_image_archive, build_layers_archive, directory_layer
from sandlot.devtools.processes import run_bounded


@dataclass(frozen=True)
class ImageRecipe:
    suite: str
    packages: tuple[str, ...]
    user_commands: tuple[str, ...]
    user: str
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    env: tuple[str, ...]
    venv: str


RECIPE = ImageRecipe(
    suite="bookworm",
    packages=("python3", "python3-venv", "iproute2", "iptables"),
    user_commands=(
        "groupadd --system --gid 65532 sandlot",
        "useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent"
        " --shell /usr/sbin/nologin sandlot",
    ),
    user="65532:65532",
    entrypoint=("sandlot",),
    cmd=("--help",),
    env=(
        "PATH=/opt/sandlot/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "PYTHONDONTWRITEBYTECODE=1",
        "PYTHONUNBUFFERED=1",
    ),
    venv="/opt/sandlot",
)
# The files tool (operator/filetool) in the image, as the Dockerfile builds it and the
# chart's agent.filesTool names it: inside the virtualenv's directory, so its layer
# carries it.
FILES_TOOL_IN_IMAGE = "/opt/sandlot/libexec/sandlot-files"
EXECUTOR_IN_IMAGE = "/opt/sandlot/libexec/sandlot-exec"  # the same for operator/executor
DEBIAN_MIRROR = os.environ.get("SANDLOT_DEBIAN_MIRROR", "http://deb.debian.org/debian")
PAUSE_IMAGE = "sandlot.local/pause:1"
PAUSE_SOURCE = """\
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
static void quit(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
  signal(SIGINT, quit);
  signal(SIGTERM, quit);
  signal(SIGCHLD, reap);
  for (;;) pause();
}
"""


def cache_dir() -> Path:
    root = os.environ.get("SANDLOT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "sandlot"
    )
    return Path(root) / "images"


def _hash(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def pause_archive() -> Path:
    """The pause image's archive (built once per source)."""
    dest = cache_dir() / f"pause-{_hash(PAUSE_SOURCE, PAUSE_IMAGE)}.tar"
    if dest.exists():
        return dest
    with tempfile.TemporaryDirectory(prefix="sl-pause-") as work:
        src, binary = Path(work) / "pause.c", Path(work) / "pause"
        src.write_text(PAUSE_SOURCE)
        run_bounded(
            ["gcc", "-static", "-Os", "-o", str(binary), str(src)], "gcc -static pause.c", 120
        )
        import io
        import tarfile

        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            info = tarfile.TarInfo("pause")
            data = binary.read_bytes()
            info.size, info.mode, info.mtime = len(data), 0o755, 0
            tar.addfile(info, io.BytesIO(data))
        build_layers_archive(
            dest, PAUSE_IMAGE, [buf.getvalue()], {"Entrypoint": ["/pause"], "User": "65535"}
        )
    return dest


GVISOR_BUILD_SCRIPT = Path(__file__).parents[1] / "controlplane" / "build-gvisor.sh"
GVISOR_BINARIES = ("runsc", "containerd-shim-runsc-v1")
RUNTIMES_IMAGE = "sandlot.local/sandlot-runtimes:dev"  # the chart's agent.runtimes.*.image


def runtimes_archive(name: str, build_timeout: float = 3000.0) -> Path:
    """The runtimes image's archive: gVisor's binaries (built once, cached by version)
    under ``/gvisor/bin`` over a static busybox; cached by the binaries' identity."""
    from sandlot.devtools.controlplane import _run_build

    gvisor = _run_build(GVISOR_BUILD_SCRIPT, "gVisor (runsc and its shim)", build_timeout)
    paths = [gvisor / b for b in GVISOR_BINARIES]
    key = _hash(name, *(f"{p}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in paths))
    dest = cache_dir() / f"runtimes-{key}.tar"
    if dest.exists():
        return dest
    tmp = dest.with_suffix(".tmp")
    build_image_archive(
        tmp, name, executable_files={f"gvisor/bin/{p.name}": p.read_bytes() for p in paths}
    )
    tmp.replace(dest)
    for old in cache_dir().glob("runtimes-*.tar"):
        if old != dest:
            old.unlink(missing_ok=True)
    return dest


def _recipe_key() -> str:
    return _hash(json.dumps(RECIPE.__dict__, sort_keys=True), DEBIAN_MIRROR)


def base_layer() -> Path:
    """Layer 1: ``debootstrap --variant=minbase`` with the recipe's packages and user."""
    out = cache_dir() / f"base-{_recipe_key()}"
    layer = out / "layer.tar"
    if layer.exists():
        return layer
    rootfs = out / "rootfs"
    if not (out / "rootfs.done").exists():
        _bootstrap(rootfs)
        (out / "rootfs.done").write_text(RECIPE.suite)
    tmp = layer.with_suffix(".tmp")
    tmp.write_bytes(directory_layer(rootfs))
    tmp.replace(layer)
    return layer


def _bootstrap(rootfs: Path) -> None:
    if shutil.which("debootstrap") is None:
        raise RuntimeError("debootstrap is not installed (OS package debootstrap)")
    shutil.rmtree(rootfs.parent, ignore_errors=True)
    rootfs.mkdir(parents=True)
    run_bounded(
        ["debootstrap", "--variant=minbase", f"--include={','.join(RECIPE.packages)}",
         RECIPE.suite, str(rootfs), DEBIAN_MIRROR],
        "debootstrap", 1800,
    )  # fmt: skip
    for command in RECIPE.user_commands:
        run_bounded(["chroot", str(rootfs), "sh", "-c", command], command, 60)
    # As the Dockerfile's apt-get lines leave it: no package lists, no apt cache.
    for leftover in ("var/lib/apt/lists", "var/cache/apt/archives"):
        for child in (rootfs / leftover).glob("*"):
            if child.is_file() and child.name != "lock":
                child.unlink()


# What the image runs: the dependencies, pinned with their hashes (`make lock`).
RUNTIME_LOCK = "requirements/runtime.txt"


def _build_requirements(root: Path) -> list[str]:
    project = tomllib.loads((root / "pyproject.toml").read_text())
    return [*project["build-system"]["requires"], "wheel"]


def wheelhouse(root: Path) -> Path:
    """The runtime lock's files, as PyPI serves them so that their hashes hold, and the
    wheels that build the package (pip, online, once per lock)."""
    lock = root / RUNTIME_LOCK
    build = _build_requirements(root)
    out = cache_dir() / f"wheels-{_hash(lock.read_bytes(), *build, sys.version)}"
    if (out / ".done").exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    run_bounded(
        [sys.executable, "-m", "pip", "download", "-q", "--require-hashes",
         "--only-binary=:all:", "-d", str(out), "-r", str(lock)],
        f"pip download -r {RUNTIME_LOCK}", 1800,
    )  # fmt: skip
    run_bounded(
        [sys.executable, "-m", "pip", "wheel", "-q", "-w", str(out), *build], "pip wheel", 600
    )
    (out / ".done").write_text("\n".join([RUNTIME_LOCK, *build]))
    return out


def _source_files(root: Path) -> Iterable[Path]:
    yield root / "pyproject.toml"
    yield root / "README.md"
    for path in sorted((root / "operator").rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and "__pycache__" not in rel and "/containerd/gen/" not in rel:
            yield path


def sandlot_archive(root: Path, name: str) -> Path:
    """The sandlot image's archive for the source tree at ``root`` (cached by content)."""
    layer1 = base_layer()
    wheels = wheelhouse(root)
    h = hashlib.sha256(layer1.parent.name.encode() + wheels.name.encode() + name.encode())
    for path in _source_files(root):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    dest = cache_dir() / f"sandlot-{h.hexdigest()[:16]}.tar"
    if dest.exists():
        return dest
    with tempfile.TemporaryDirectory(prefix="sl-image-", dir=cache_dir()) as work:
        layer2 = _venv_layer(root, layer1.parent / "rootfs", wheels, Path(work))
        config = {
            "Entrypoint": list(RECIPE.entrypoint),
            "Cmd": list(RECIPE.cmd),
            "Env": list(RECIPE.env),
            "User": RECIPE.user,
            "WorkingDir": "/",
        }
        build_layers_archive(dest, name, [layer1.read_bytes(), layer2], config)
    for old in cache_dir().glob("sandlot-*.tar"):
        if old != dest:
            old.unlink(missing_ok=True)
    return dest


def _venv_layer(root: Path, rootfs: Path, wheels: Path, work: Path) -> bytes:
    """Layer 2: the recipe's virtualenv, made in the rootfs (an overlay, in a mount
    namespace of its own) and taken from the overlay's upper directory."""
    staging = work / "src"
    for path in _source_files(root):
        target = staging / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    gen = staging / "operator/sandlot/adapters/containerd/gen"
    run_bounded(
        [sys.executable, "-m", "sandlot.devtools.gen_stubs", "--source", "debian",
         "--force", "--out", str(gen)],
        "containerd stubs (debian source)", 300, env=dict(os.environ, PYTHONPATH=str(staging / "operator")),
    )  # fmt: skip
    own = work / "own"
    run_bounded(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index",
         "--find-links", str(wheels), "-w", str(own), str(staging)],
        "pip wheel sandlot", 600,
    )  # fmt: skip
    package = next(own.glob("sandlot-*.whl")).name
    shutil.copy2(root / RUNTIME_LOCK, own / "runtime.txt")
    upper, scratch, merged = work / "upper", work / "scratch", work / "merged"
    for d in (upper, scratch, merged):
        d.mkdir()
    script = f"""set -eu
mount -t overlay overlay -o lowerdir={rootfs},upperdir={upper},workdir={scratch} {merged}
mkdir -p {merged}/wheels/deps {merged}/wheels/own
mount --bind {wheels} {merged}/wheels/deps
mount --bind {own} {merged}/wheels/own
mount -t proc proc {merged}/proc
chroot {merged} /usr/bin/python3 -m venv {RECIPE.venv}
pip="chroot {merged} env PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 {RECIPE.venv}/bin/pip"
$pip install -q --no-index --find-links /wheels/deps --require-hashes -r /wheels/own/runtime.txt
$pip install -q --no-index --no-deps /wheels/own/{package}
$pip check
chroot {merged} {RECIPE.venv}/bin/python -c "import sandlot.adapters.containerd.client"
chroot {merged} {RECIPE.venv}/bin/sandlot --help >/dev/null
install -D -m 0755 {files_tool_path()} {merged}{FILES_TOOL_IN_IMAGE}
chroot {merged} {FILES_TOOL_IN_IMAGE} stat / >/dev/null
install -D -m 0755 {executor_path()} {merged}{EXECUTOR_IN_IMAGE}
chroot {merged} {EXECUTOR_IN_IMAGE} 5 </dev/null >/dev/null
"""
    run_bounded(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
         "virtualenv layer", 900)  # fmt: skip
    return directory_layer(upper, only=[RECIPE.venv.lstrip("/")])


def main() -> int:
    """Build (or find cached) every image the local cluster imports."""
    from sandlot.devtools.cluster.commands import IMAGE, repo_root

    print(f"pause image: {pause_archive()}")
    print(f"sandlot image: {sandlot_archive(repo_root(), IMAGE)}")
    print(f"runtimes image: {runtimes_archive(RUNTIMES_IMAGE)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
