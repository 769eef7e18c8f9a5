"""AppArmor where the node has it, user namespaces refused with the reason where
the kernel allows none, from facts probed once (the probing of /sys and /proc is
tested on files laid out like it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sandlot.adapters.nodeguard import apparmor_profiles, user_namespaces_allowed
from sandlot.api.reasons import SandboxReason
from sandlot.api.sandbox import SandboxSpec
from sandlot.policy.nodesecurity import (
    IsolationUnavailable,
    NodeSecurity,
    apparmor_profile,
    check_user_namespace,
)
from sandlot.policy.ocispec import ImageConfig, build_oci_spec

CRI = "cri-containerd.apparmor.d"


@pytest.mark.parametrize(
    ("loaded", "wanted", "privileged", "profile"),
    [
        (None, CRI, False, None),
        (frozenset({CRI, "other"}), CRI, False, CRI),
        (frozenset({CRI}), CRI, True, None),
        (frozenset({CRI}), "", False, None),
    ],
    ids=["no apparmor on the node", "loaded", "privileged runs unconfined", "opted out"],
)
def test_apparmor_profile(
    loaded: frozenset[str] | None, wanted: str, privileged: bool, profile: str | None
) -> None:
    node = NodeSecurity(apparmor_profiles=loaded)
    assert apparmor_profile(node, wanted, privileged=privileged) == profile


def test_a_profile_that_is_not_loaded_fails_closed_naming_it() -> None:
    with pytest.raises(IsolationUnavailable, match=re.escape(CRI)) as refused:
        apparmor_profile(NodeSecurity(frozenset({"other"})), CRI, privileged=False)
    assert refused.value.reason == SandboxReason.APPARMOR_PROFILE_MISSING


def test_profile_reaches_the_oci_spec() -> None:
    spec = SandboxSpec.model_validate({"image": "i", "command": ["sh"]})
    oci = build_oci_spec("sb", spec, ImageConfig(), hostname="b", apparmor_profile=CRI)
    assert oci["process"]["apparmorProfile"] == CRI
    assert (
        "apparmorProfile" not in build_oci_spec("sb", spec, ImageConfig(), hostname="b")["process"]
    )


def test_host_users_false_is_refused_where_the_kernel_allows_no_user_namespaces() -> None:
    with pytest.raises(IsolationUnavailable, match=r"spec\.hostUsers: false") as refused:
        check_user_namespace(NodeSecurity(kernel=(6, 8), user_namespaces=False), False)
    assert refused.value.reason == SandboxReason.USER_NAMESPACES_UNSUPPORTED
    assert "user.max_user_namespaces is 0" in str(refused.value)


@pytest.mark.parametrize(
    ("kernel", "allowed"),
    [((6, 18), True), ((5, 4), True), (None, None)],
    ids=["new kernel", "old kernel, no idmapped mounts needed", "unknown"],
)
def test_host_users_false_passes_where_user_namespaces_may_exist(
    kernel: tuple[int, int] | None, allowed: bool | None
) -> None:
    check_user_namespace(NodeSecurity(kernel=kernel, user_namespaces=allowed), False)


@pytest.mark.parametrize(
    ("content", "allowed"),
    [("15000\n", True), ("0\n", False), ("junk", None), (None, None)],
    ids=["allowed", "zero", "unreadable value", "absent"],
)
def test_user_namespace_sysctl_is_read(
    tmp_path: Path, content: str | None, allowed: bool | None
) -> None:
    sysctl = tmp_path / "max_user_namespaces"
    if content is not None:
        sysctl.write_text(content)
    assert user_namespaces_allowed(sysctl) is allowed


@pytest.mark.parametrize("host_users", [None, True], ids=["unset", "true"])
def test_host_users_unset_or_true_passes(host_users: bool | None) -> None:
    check_user_namespace(NodeSecurity(kernel=(6, 8)), host_users)


def _sys(tmp_path: Path, enabled: str | None, profiles: str | None) -> Path:
    if enabled is not None:
        param = tmp_path / "module/apparmor/parameters/enabled"
        param.parent.mkdir(parents=True)
        param.write_text(enabled)
    if profiles is not None:
        listing = tmp_path / "kernel/security/apparmor/profiles"
        listing.parent.mkdir(parents=True)
        listing.write_text(profiles)
    return tmp_path


@pytest.mark.parametrize(
    ("enabled", "profiles", "found"),
    [
        (None, None, None),
        ("N\n", None, None),
        ("Y\n", f"{CRI} (enforce)\n/usr/bin/man (complain)\n", frozenset({CRI, "/usr/bin/man"})),
        ("Y\n", None, frozenset()),
    ],
    ids=["no module", "disabled", "enabled with profiles", "enabled, securityfs hidden"],
)
def test_apparmor_detection(
    tmp_path: Path, enabled: str | None, profiles: str | None, found: frozenset[str] | None
) -> None:
    assert apparmor_profiles(_sys(tmp_path, enabled, profiles)) == found
