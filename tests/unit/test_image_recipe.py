"""The Dockerfile and the recipe that builds the same image without Docker
(``sandlot.devtools.cluster.images.RECIPE``) say the same things: base suite,
packages, user, entrypoint, command, environment, and how ``/opt/sandlot`` is made
(from the runtime lock, ``requirements/runtime.txt``).
The image built from the recipe is checked against the source tree in
e2e/test_local_cluster.py (its ``/opt/sandlot``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from sandlot.devtools.cluster.images import (
    EXECUTOR_IN_IMAGE,
    FILES_TOOL_IN_IMAGE,
    RECIPE,
    RUNTIME_LOCK,
)

DOCKERFILE = Path(__file__).resolve().parents[2] / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), " ".join(rest.split())))
    return out


def _final_stage() -> list[tuple[str, str]]:
    steps = _instructions()
    last_from = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last_from:]


def _installed(run: str) -> list[str]:
    """The packages of an ``apt-get install ... --no-install-recommends`` command."""
    after = run.split("--no-install-recommends", 1)[1]
    return after.split("&&", 1)[0].split()


def _args() -> dict[str, str]:
    return dict(arg.split("=", 1) for word, arg in _instructions() if word == "ARG")


def test_both_stages_start_from_the_recipes_debian() -> None:
    froms = [arg.split()[0] for word, arg in _instructions() if word == "FROM"]
    base = _args()["DEBIAN_IMAGE"]
    assert froms == ["${DEBIAN_IMAGE}", "${DEBIAN_IMAGE}"], froms
    assert base == f"debian:{RECIPE.suite}-slim", base


def test_the_final_stage_installs_the_recipes_packages() -> None:
    runs = [arg for word, arg in _final_stage() if word == "RUN" and "apt-get install" in arg]
    assert len(runs) == 1, runs
    assert sorted(_installed(runs[0])) == sorted(RECIPE.packages)


def test_the_virtualenv_is_made_by_the_same_packages_python() -> None:
    first = next(arg for word, arg in _instructions() if word == "RUN" and "apt-get install" in arg)
    python = {p for p in RECIPE.packages if p.startswith("python3")}
    assert python <= set(_installed(first)), _installed(first)
    venv_runs = [arg for word, arg in _instructions() if word == "RUN" and RECIPE.venv in arg]
    made = [r for r in venv_runs if f"python3 -m venv {RECIPE.venv}" in r]
    assert len(made) == 1, venv_runs
    # The runtime lock, its hashes checked, then the project alone: no pip upgrade, no
    # extra package, no dependency the lock does not pin (the recipe does the same).
    installs = re.findall(rf"{RECIPE.venv}/bin/pip install ([^&]+)", made[0])
    wanted = [f"--require-hashes -r {RUNTIME_LOCK}", "--no-deps ."]
    assert [i.strip() for i in installs] == wanted, installs
    assert f"{RECIPE.venv}/bin/pip check" in made[0], made[0]


def test_the_build_stage_copies_the_runtime_lock() -> None:
    copies = [a for w, a in _instructions() if w == "COPY"]
    assert f"{RUNTIME_LOCK} ./{RUNTIME_LOCK.rsplit('/', 1)[0]}/" in copies, copies


@pytest.mark.parametrize("command", RECIPE.user_commands, ids=["group", "user"])
def test_the_user_is_made_the_same_way(command: str) -> None:
    runs = " ".join(arg for word, arg in _final_stage() if word == "RUN")
    assert command in runs, f"{command!r} not in the Dockerfile's final stage"


def test_user_entrypoint_command_and_environment_match() -> None:
    stage = _final_stage()
    assert [a for w, a in stage if w == "USER"] == [RECIPE.user]
    assert [json.loads(a) for w, a in stage if w == "ENTRYPOINT"] == [list(RECIPE.entrypoint)]
    assert [json.loads(a) for w, a in stage if w == "CMD"] == [list(RECIPE.cmd)]
    env = " ".join(a for w, a in stage if w == "ENV").split()
    assert env == list(RECIPE.env)


def test_the_final_stage_copies_only_the_virtualenv() -> None:
    copies = [a for w, a in _final_stage() if w == "COPY"]
    assert copies == [f"--from=build {RECIPE.venv} {RECIPE.venv}"], copies


def test_both_recipes_ship_the_files_tool_where_the_chart_looks_for_it() -> None:
    values = yaml.safe_load((DOCKERFILE.parent / "charts/sandlot/values.yaml").read_text())
    assert values["agent"]["filesTool"] == FILES_TOOL_IN_IMAGE
    # Inside the virtualenv's directory: the final stage's one COPY, the recipe's layer.
    assert FILES_TOOL_IN_IMAGE.startswith(f"{RECIPE.venv}/")
    steps = _instructions()
    build_stage = steps[: max(i for i, (word, _) in enumerate(steps) if word == "FROM")]
    builds = [a for w, a in build_stage if w == "RUN" and "cd operator/filetool" in a]
    assert len(builds) == 1 and f"-o {FILES_TOOL_IN_IMAGE} ." in builds[0], builds
    assert "CGO_ENABLED=0" in builds[0], "static: it runs in any sandbox's root"


def test_both_recipes_ship_the_executor_where_the_chart_looks_for_it() -> None:
    values = yaml.safe_load((DOCKERFILE.parent / "charts/sandlot/values.yaml").read_text())
    assert values["agent"]["executor"] == EXECUTOR_IN_IMAGE
    assert EXECUTOR_IN_IMAGE.startswith(f"{RECIPE.venv}/")
    steps = _instructions()
    build_stage = steps[: max(i for i, (word, _) in enumerate(steps) if word == "FROM")]
    builds = [a for w, a in build_stage if w == "RUN" and "cd operator/executor" in a]
    assert len(builds) == 1 and f"-o {EXECUTOR_IN_IMAGE} ." in builds[0], builds
    assert "CGO_ENABLED=0" in builds[0], "static: it runs in any sandbox's root"
