"""Generate the Python gRPC stubs for the containerd services the agent uses.

The stubs are generated at setup time from containerd's own ``.proto`` files and
never committed, so there is exactly one source for them. Two sources are known:

- ``go``: the Go module ``github.com/containerd/containerd/api`` (plain protobuf,
  no gogo extensions), fetched with ``go mod download`` (the module cache makes it
  work offline once fetched). Its service and message names are the ones
  containerd 1.6 serves; fields added since are ignored by an older daemon.
- ``debian``: the files shipped by ``golang-github-containerd-containerd-dev``
  plus ``gogo.proto`` from ``golang-github-gogo-protobuf-dev``.

The Transfer and Streaming services (which containerd 2.x pulls through) are not
in Debian's 1.6 files, and its runc shim options sit outside the API tree there
(``runtime/v2/runc/options``): ``containerd_protos/`` next to this module holds them,
copied from the Go module, and a file is taken from there only when the source
lacks it.

The files are copied into a staging tree under the import prefix
``sandlot/adapters/containerd/gen/`` (their ``import`` lines rewritten to match)
so that the generated modules import each other as
``sandlot.adapters.containerd.gen...``: no ``sys.path`` tricks at import time.
Only the closure of the services listed in ``SERVICES`` is generated.

Run ``python -m sandlot.devtools.gen_stubs``; it returns at once when
the stubs are already there for the same source and inputs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

GO_MODULE = "github.com/containerd/containerd/api"
# The oldest release of the standalone API module: the closest to 1.6's wire API.
GO_MODULE_VERSION = "v1.8.0"
DEBIAN_API_ROOT = Path("/usr/share/gocode/src/github.com/containerd/containerd/api")
DEBIAN_GOGO_PROTO = Path("/usr/share/gocode/src/github.com/gogo/protobuf/gogoproto/gogo.proto")

# Services the agent calls, as paths relative to the API module root.
SERVICES = (
    "services/version/v1/version.proto",
    "services/containers/v1/containers.proto",
    "services/tasks/v1/tasks.proto",
    "services/images/v1/images.proto",
    "services/content/v1/content.proto",
    "services/snapshots/v1/snapshots.proto",
    "services/leases/v1/leases.proto",
    "services/diff/v1/diff.proto",
    "services/transfer/v1/transfer.proto",
    "services/streaming/v1/streaming.proto",
    # Carried inside the Transfer service's Any fields, so imported by no service.
    "types/transfer/registry.proto",
    "types/transfer/imagestore.proto",
    "types/transfer/progress.proto",
    # The runc shim's options (BinaryName: crun as a runtime handler), carried in Any.
    "types/runc/options/oci.proto",
)
VENDORED_API_ROOT = Path(__file__).resolve().parent / "containerd_protos"

PACKAGE_PREFIX = "sandlot/adapters/containerd/gen"
API_IMPORT_PREFIX = GO_MODULE + "/"
GOGO_IMPORT = "gogoproto/gogo.proto"
STAMP_NAME = ".stamp.json"
# Bumped when the generation procedure changes, so old trees are regenerated.
GENERATOR_REVISION = 3

# The runtime imports the stubs from the adapter package, so they are written there.
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "adapters" / "containerd" / "gen"

_IMPORT_RE = re.compile(r'^(\s*import\s+(?:weak\s+|public\s+)?")([^"]+)(";)', re.MULTILINE)


class StubSourceMissing(Exception):
    """Neither source of containerd's ``.proto`` files is available."""


@dataclass(frozen=True)
class ProtoSource:
    name: str  # "go" or "debian"
    api_root: Path  # the directory standing for github.com/containerd/containerd/api
    gogo_proto: Path | None = None
    identity: str = ""  # what was used, for the stamp


def _go_module_source(timeout: float = 120.0) -> ProtoSource:
    go = shutil.which("go")
    if go is None:
        raise StubSourceMissing("the `go` command is not on PATH")
    try:
        proc = subprocess.run(
            [go, "mod", "download", "-json", f"{GO_MODULE}@{GO_MODULE_VERSION}"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=tempfile.gettempdir(),
            env={**os.environ, "GO111MODULE": "on"},
        )
    except subprocess.TimeoutExpired as exc:
        raise StubSourceMissing(
            f"`go mod download {GO_MODULE}@{GO_MODULE_VERSION}` timed out after {timeout:.0f}s"
        ) from exc
    try:
        info = json.loads(proc.stdout or "{}")
    except json.JSONDecodeError:
        info = {}
    directory = info.get("Dir")
    if proc.returncode != 0 or not directory or not Path(directory).is_dir():
        detail = info.get("Error") or proc.stderr.strip() or f"exit status {proc.returncode}"
        raise StubSourceMissing(
            f"`go mod download {GO_MODULE}@{GO_MODULE_VERSION}` failed: {detail}"
        )
    return ProtoSource(
        "go", Path(directory), identity=f"{GO_MODULE}@{GO_MODULE_VERSION} {info.get('Sum', '')}"
    )


def _debian_source() -> ProtoSource:
    missing = []
    if not (DEBIAN_API_ROOT / SERVICES[0]).is_file():
        missing.append(f"{DEBIAN_API_ROOT} (package golang-github-containerd-containerd-dev)")
    if not DEBIAN_GOGO_PROTO.is_file():
        missing.append(f"{DEBIAN_GOGO_PROTO} (package golang-github-gogo-protobuf-dev)")
    if missing:
        raise StubSourceMissing("missing " + " and ".join(missing))
    return ProtoSource(
        "debian", DEBIAN_API_ROOT, DEBIAN_GOGO_PROTO, identity=f"debian {DEBIAN_API_ROOT}"
    )


def find_source(preference: str = "auto") -> ProtoSource:
    """The first available source, in the order ``preference`` asks for."""
    order = {"auto": ("go", "debian"), "go": ("go",), "debian": ("debian",)}[preference]
    finders = {"go": _go_module_source, "debian": _debian_source}
    reasons = []
    for name in order:
        try:
            return finders[name]()
        except StubSourceMissing as exc:
            reasons.append(f"{name}: {exc}")
    raise StubSourceMissing(
        "no source of containerd's API .proto files is available:\n  "
        + "\n  ".join(reasons)
        + f"\nInstall Go (to fetch {GO_MODULE}@{GO_MODULE_VERSION}) or the Debian packages "
        "golang-github-containerd-containerd-dev and golang-github-gogo-protobuf-dev."
    )


def _rewrite_imports(text: str) -> str:
    def fix(match: re.Match[str]) -> str:
        target = match.group(2)
        if target.startswith(API_IMPORT_PREFIX):
            target = f"{PACKAGE_PREFIX}/{target[len(API_IMPORT_PREFIX) :]}"
        elif target == GOGO_IMPORT:
            target = f"{PACKAGE_PREFIX}/{GOGO_IMPORT}"
        return f"{match.group(1)}{target}{match.group(3)}"

    return _IMPORT_RE.sub(fix, text)


def _stage(source: ProtoSource, staging: Path) -> list[str]:
    """Copy the closure of SERVICES into ``staging``; return the staged proto paths."""
    pending = list(SERVICES)
    staged: dict[str, None] = {}
    while pending:
        rel = pending.pop()
        if rel in staged:
            continue
        if rel == GOGO_IMPORT:
            if source.gogo_proto is None:
                raise StubSourceMissing(f"{source.name} source imports {GOGO_IMPORT}")
            text = source.gogo_proto.read_text()
        else:
            path = source.api_root / rel
            if not path.is_file() and (VENDORED_API_ROOT / rel).is_file():
                path = VENDORED_API_ROOT / rel
            if not path.is_file():
                raise StubSourceMissing(f"{source.name} source lacks {rel} (under {path.parent})")
            text = path.read_text()
        for imported in _IMPORT_RE.findall(text):
            target = imported[1]
            if target.startswith(API_IMPORT_PREFIX):
                pending.append(target[len(API_IMPORT_PREFIX) :])
            elif target == GOGO_IMPORT:
                pending.append(GOGO_IMPORT)
        dest = staging / PACKAGE_PREFIX / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(_rewrite_imports(text))
        staged[rel] = None
    return sorted(f"{PACKAGE_PREFIX}/{rel}" for rel in staged)


def _fingerprint(source: ProtoSource) -> dict[str, str | int]:
    import grpc_tools  # setup-time only: grpcio-tools is a dev dependency

    version = getattr(grpc_tools, "__version__", "")
    if not version:
        from importlib.metadata import version as dist_version

        version = dist_version("grpcio-tools")
    return {
        "revision": GENERATOR_REVISION,
        "source": source.identity,
        "services": ",".join(SERVICES),
        "grpcio_tools": version,
    }


def _is_current(out: Path, fingerprint: dict[str, str | int]) -> bool:
    stamp = out / STAMP_NAME
    try:
        return bool(json.loads(stamp.read_text()) == fingerprint)
    except (OSError, json.JSONDecodeError):
        return False


def generate(out: Path = DEFAULT_OUT, preference: str = "auto", force: bool = False) -> Path:
    """Generate the stubs into ``out`` (replacing it atomically); return ``out``."""
    source = find_source(preference)
    fingerprint = _fingerprint(source)
    if not force and _is_current(out, fingerprint):
        return out

    from grpc_tools import protoc

    well_known = Path(protoc.__file__).resolve().parent / "_proto"
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sandlot-stubs-", dir=out.parent) as work:
        staging = Path(work) / "protos"
        python_out = Path(work) / "python"
        python_out.mkdir()
        protos = _stage(source, staging)
        status = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{staging}",
                f"-I{well_known}",
                f"--python_out={python_out}",
                f"--grpc_python_out={python_out}",
                *protos,
            ]
        )
        if status != 0:
            raise RuntimeError(f"protoc failed (status {status}) on {source.identity}")
        generated = python_out / PACKAGE_PREFIX
        for directory in [generated, *(p for p in generated.rglob("*") if p.is_dir())]:
            init = directory / "__init__.py"
            if not init.exists():
                init.write_text("")
        (generated / "__init__.py").write_text(
            f'"""Generated by sandlot.devtools.gen_stubs from {source.identity}."""\n'
        )
        (generated / STAMP_NAME).write_text(json.dumps(fingerprint, indent=2) + "\n")
        old = Path(work) / "old"
        if out.exists():
            out.rename(old)
        generated.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--source",
        choices=("auto", "go", "debian"),
        default=os.environ.get("SANDLOT_CONTAINERD_PROTO_SOURCE", "auto"),
        help="where to take containerd's .proto files from (default: go, then debian)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output package directory")
    parser.add_argument("--force", action="store_true", help="regenerate even if up to date")
    args = parser.parse_args(argv)
    try:
        out = generate(args.out, args.source, args.force)
    except StubSourceMissing as exc:
        print(f"gen_stubs: {exc}", file=sys.stderr)
        return 2
    print(f"containerd stubs ready in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
