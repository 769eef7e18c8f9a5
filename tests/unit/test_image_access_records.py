"""agent.pulling.access: the verified pairs on disk, and what a lost or broken file means
(a verification more, never one skipped)."""

from __future__ import annotations

from pathlib import Path

from sandlot.agent.pulling.access import ImageAccess, access_file
from sandlot.api.keys import PULLED_BY_AGENT_LABEL
from sandlot.policy.pulling.credentials import VerifyPolicy

IMAGE = "reg.example/team/private:1"
PULLED = {PULLED_BY_AGENT_LABEL: "true"}


def _access(path: Path) -> ImageAccess:
    return ImageAccess(path, VerifyPolicy.NEVER_VERIFY_PRELOADED)


def test_a_recorded_pair_holds_for_a_new_agent_on_the_same_file(tmp_path: Path) -> None:
    path = access_file(str(tmp_path), "node-a")
    _access(path).record(IMAGE, "sha256:a")
    again = _access(path)
    assert not again.needs_verification(IMAGE, "sha256:a", PULLED)
    assert again.needs_verification(IMAGE, "sha256:b", PULLED)


def test_a_lost_or_broken_file_means_verifying_again(tmp_path: Path) -> None:
    path = access_file(str(tmp_path), "node-a")
    _access(path).record(IMAGE, "sha256:a")
    path.write_text("{not json")
    assert _access(path).needs_verification(IMAGE, "sha256:a", PULLED)
    path.unlink()
    assert _access(path).needs_verification(IMAGE, "sha256:a", PULLED)


def test_preloaded_means_the_image_record_lacks_the_agents_label(tmp_path: Path) -> None:
    access = _access(access_file(str(tmp_path), "node-a"))
    assert not access.needs_verification(IMAGE, "sha256:b", {})
    assert access.needs_verification(IMAGE, "sha256:b", PULLED)


def test_an_unwritable_state_dir_keeps_the_pair_in_memory(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    access = _access(blocker / "image-access-node-a.json")
    access.record(IMAGE, "sha256:a")  # logged, not raised
    assert not access.needs_verification(IMAGE, "sha256:a", PULLED)
