"""The pins of the dependency locks (``requirements/*.txt``, written by ``make lock``):
read here once for the unit test that keeps them in step with pyproject.toml and for
the local cluster's check that the image installs exactly the runtime lock."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
RUNTIME_LOCK = ROOT / "requirements" / "runtime.txt"  # what the image installs
DEV_LOCK = ROOT / "requirements" / "dev.txt"  # what `make setup` and CI install
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+?)\s*(?:;.*)?\\?$")


def pins(lock: Path) -> dict[NormalizedName, Version]:
    """Name -> pinned version of every requirement line (``name==version \\``)."""
    out: dict[NormalizedName, Version] = {}
    for line in lock.read_text().splitlines():
        found = PIN.match(line.strip())
        if found:
            out[canonicalize_name(found.group(1))] = Version(found.group(2))
    return out


def hashed(lock: Path) -> dict[NormalizedName, int]:
    """Name -> how many ``--hash`` options follow its pin."""
    out: dict[NormalizedName, int] = {}
    current: NormalizedName | None = None
    for line in lock.read_text().splitlines():
        found = PIN.match(line.strip())
        if found:
            current = canonicalize_name(found.group(1))
            out[current] = 0
        elif current is not None and line.strip().startswith("--hash=sha256:"):
            out[current] += 1
        elif not line.startswith(" "):
            current = None
    return out


def declared(extra: str | None = None) -> list[Requirement]:
    """pyproject.toml's runtime dependencies, or those of one extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = project["optional-dependencies"][extra] if extra else project["dependencies"]
    return [Requirement(line) for line in lines]
