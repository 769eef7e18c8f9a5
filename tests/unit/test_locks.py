"""The dependency locks say what pyproject.toml says: every dependency it names is
pinned, at a version inside its bounds, with hashes; the image's lock and the
development lock pin a shared dependency at the same version, so that the tests run
what the image runs. A failure here means pyproject.toml changed after the locks
were written: run `make lock` (it keeps every pin the new bounds still allow)."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.locks import DEV_LOCK, RUNTIME_LOCK, declared, hashed, pins

FIX = "pyproject.toml and the locks differ: run `make lock` and commit requirements/"
LOCKS = {
    "runtime": (RUNTIME_LOCK, declared()),
    "dev": (DEV_LOCK, declared() + declared("dev")),
}


def _out_of_step(lock: Path, wanted: list[Requirement]) -> list[str]:
    pinned = pins(lock)
    wrong = []
    for requirement in wanted:
        version = pinned.get(canonicalize_name(requirement.name))
        if version is None:
            wrong.append(f"{requirement.name} is not pinned")
        elif not requirement.specifier.contains(version, prereleases=True):
            wrong.append(f"{requirement.name}=={version} is outside {requirement.specifier}")
    return wrong


@pytest.mark.parametrize("which", sorted(LOCKS))
def test_the_lock_pins_every_declared_dependency_inside_its_bounds(which: str) -> None:
    lock, wanted = LOCKS[which]
    wrong = _out_of_step(lock, wanted)
    assert not wrong, f"{lock.relative_to(lock.parents[1])}: {'; '.join(wrong)}. {FIX}"


@pytest.mark.parametrize("which", sorted(LOCKS))
def test_every_pin_carries_a_hash_and_the_lock_says_how_it_was_made(which: str) -> None:
    lock, _ = LOCKS[which]
    bare = sorted(name for name, count in hashed(lock).items() if count == 0)
    assert pins(lock) and not bare, f"{lock.name}: pins without --hash: {bare}. {FIX}"
    header = lock.read_text().split("\n\n", 1)[0]
    assert "pip-compile" in header and "--generate-hashes" in header, header


def test_the_image_and_the_tests_run_the_same_versions() -> None:
    runtime, dev = pins(RUNTIME_LOCK), pins(DEV_LOCK)
    differ = {
        name: (str(v), str(dev.get(name))) for name, v in runtime.items() if dev.get(name) != v
    }
    assert not differ, f"runtime.txt vs dev.txt (runtime, dev): {differ}. {FIX}"


def test_an_out_of_bounds_pin_is_reported(tmp_path: Path) -> None:
    """The check itself: a lock older than pyproject's bounds, or missing a name, fails."""
    lock = tmp_path / "lock.txt"
    lock.write_text("kopf==1.44.0 \\\n    --hash=sha256:00\n")
    wrong = _out_of_step(lock, [Requirement("kopf>=1.45.2,<1.46"), Requirement("mcp>=2.3")])
    assert wrong == ["kopf==1.44.0 is outside <1.46,>=1.45.2", "mcp is not pinned"], wrong
