"""A sandbox's environment resolved as the kubelet resolves a container's
(policy.envrefs), and the Pod API's shapes refusing malformed references."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from sandlot.api.sandbox import SandboxSpec
from sandlot.controllers.pullcredentials import wanted_references
from sandlot.policy.envrefs import (
    EnvReferenceMissing,
    Referenced,
    decode,
    encode,
    resolve,
    wanted_keys,
)

NS = "tenant"


def spec(env: list[dict[str, Any]] | None = None, env_from: list[Any] | None = None) -> SandboxSpec:
    return SandboxSpec.model_validate(
        {"image": "busybox", "env": env or [], "envFrom": env_from or []}
    )


def secret_key(var: str, name: str, key: str, optional: bool | None = None) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": name, "key": key}
    if optional is not None:
        ref["optional"] = optional
    return {"name": var, "valueFrom": {"secretKeyRef": ref}}


def config_key(var: str, name: str, key: str, optional: bool | None = None) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": name, "key": key}
    if optional is not None:
        ref["optional"] = optional
    return {"name": var, "valueFrom": {"configMapKeyRef": ref}}


DB = {("secret", "db"): Referenced(True, {"pw": "s3cret", "user": "app"})}
CM = {("configmap", "cfg"): Referenced(True, {"LEVEL": "debug", "pw": "from-cm"})}
GONE_SECRET = {("secret", "db"): Referenced(False)}
GONE_CM = {("configmap", "cfg"): Referenced(False)}


@pytest.mark.parametrize(
    ("env", "env_from", "objects", "expected"),
    [
        ([{"name": "A", "value": "1"}], [], {}, [("A", "1")]),
        ([secret_key("PW", "db", "pw")], [], DB, [("PW", "s3cret")]),
        ([config_key("L", "cfg", "LEVEL")], [], CM, [("L", "debug")]),
        # envFrom first, env after: env wins, in the order variables first appear.
        (
            [config_key("pw", "cfg", "pw"), {"name": "X", "value": "x"}],
            [{"secretRef": {"name": "db"}}],
            {**DB, **CM},
            [("pw", "from-cm"), ("user", "app"), ("X", "x")],
        ),
        (
            [],
            [{"prefix": "DB_", "secretRef": {"name": "db"}}],
            DB,
            [("DB_pw", "s3cret"), ("DB_user", "app")],
        ),
        # A later envFrom replaces an earlier one's variable.
        (
            [],
            [{"configMapRef": {"name": "cfg"}}, {"secretRef": {"name": "db"}}],
            {**DB, **CM},
            [("LEVEL", "debug"), ("pw", "s3cret"), ("user", "app")],
        ),
        # Optional misses are skipped: a missing key, a missing object.
        ([secret_key("PW", "db", "nope", optional=True)], [], DB, []),
        ([secret_key("PW", "db", "pw", optional=True)], [], GONE_SECRET, []),
        ([], [{"configMapRef": {"name": "cfg", "optional": True}}], GONE_CM, []),
        (
            [config_key("L", "cfg", "x", optional=True), {"name": "B", "value": "b"}],
            [],
            GONE_CM,
            [("B", "b")],
        ),
    ],
    ids=[
        "plain",
        "secret-key",
        "configmap-key",
        "env-after-envfrom",
        "prefix",
        "later-envfrom-wins",
        "optional-missing-key",
        "optional-missing-secret",
        "optional-missing-envfrom",
        "optional-skipped-rest-kept",
    ],
)
def test_resolved_as_the_kubelet_does(
    env: list[dict[str, Any]],
    env_from: list[Any],
    objects: dict[Any, Referenced],
    expected: list[tuple[str, str]],
) -> None:
    s = spec(env, env_from)
    assert resolve(NS, s.env, s.env_from, objects) == expected


@pytest.mark.parametrize(
    ("env", "env_from", "objects", "message"),
    [
        ([secret_key("PW", "db", "pw")], [], GONE_SECRET, 'secret "db" not found'),
        ([config_key("L", "cfg", "L")], [], GONE_CM, 'configmap "cfg" not found'),
        ([secret_key("PW", "db", "nope")], [], DB, "couldn't find key nope in Secret tenant/db"),
        ([config_key("L", "cfg", "x")], [], CM, "couldn't find key x in ConfigMap tenant/cfg"),
        ([], [{"secretRef": {"name": "db"}}], GONE_SECRET, 'secret "db" not found'),
        # Not brokered yet: the broker is behind, even an optional reference waits.
        ([secret_key("PW", "db", "pw", optional=True)], [], {}, 'secret "db" not yet available'),
    ],
    ids=["secret", "configmap", "secret-key", "configmap-key", "envfrom-secret", "not-brokered"],
)
def test_a_missing_object_or_key_names_it(
    env: list[dict[str, Any]], env_from: list[Any], objects: dict[Any, Referenced], message: str
) -> None:
    s = spec(env, env_from)
    with pytest.raises(EnvReferenceMissing) as missing:
        resolve(NS, s.env, s.env_from, objects)
    assert str(missing.value).startswith(message)


def test_wanted_keys_are_the_used_ones_and_envfrom_wants_all() -> None:
    s = spec(
        [secret_key("A", "db", "pw"), secret_key("B", "db", "user"), config_key("C", "cfg", "x")],
        [{"configMapRef": {"name": "cfg"}}],
    )
    assert wanted_keys(s.env, s.env_from) == {
        ("secret", "db"): {"pw", "user"},
        ("configmap", "cfg"): None,
    }


def test_wanted_references_of_a_node_leave_terminal_sandboxes_out() -> None:
    def sb(name: str, phase: str, env: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "metadata": {"namespace": NS, "name": name},
            "spec": {"image": "busybox", "env": env},
            "status": {"phase": phase},
        }

    sandboxes = [
        sb("a", "Scheduled", [secret_key("A", "db", "pw")]),
        sb("b", "Running", [secret_key("B", "db", "user")]),
        sb("c", "Failed", [secret_key("C", "old", "pw")]),
    ]
    assert wanted_references(sandboxes) == {(NS, "secret", "db"): {"pw", "user"}}
    whole = {**sandboxes[0], "spec": {"image": "b", "envFrom": [{"secretRef": {"name": "db"}}]}}
    assert wanted_references([*sandboxes, whole]) == {(NS, "secret", "db"): None}
    assert wanted_references([whole, *sandboxes]) == {(NS, "secret", "db"): None}


@pytest.mark.parametrize(
    "found", [Referenced(True, {"k": "v\n=é"}), Referenced(False), Referenced(True, {})]
)
def test_a_brokered_entry_reads_back_as_written(found: Referenced) -> None:
    assert decode(encode(found)) == found


@pytest.mark.parametrize(
    ("entry", "error"),
    [
        (
            {"name": "A", "value": "v", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
            "value may not be specified",
        ),
        ({"name": "A", "valueFrom": {}}, "exactly one of secretKeyRef, configMapKeyRef"),
        (
            {
                "name": "A",
                "valueFrom": {
                    "secretKeyRef": {"name": "s", "key": "k"},
                    "configMapKeyRef": {"name": "c", "key": "k"},
                },
            },
            "exactly one of secretKeyRef, configMapKeyRef",
        ),
        ({"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "a/b"}}}, "pattern"),
        ({"name": "A", "valueFrom": {"secretKeyRef": {"name": "", "key": "k"}}}, "at least 1"),
    ],
    ids=["value-and-valuefrom", "no-source", "two-sources", "bad-key", "no-name"],
)
def test_malformed_env_references_are_refused(entry: dict[str, Any], error: str) -> None:
    with pytest.raises(ValidationError) as refused:
        spec([entry])
    assert error in str(refused.value)


@pytest.mark.parametrize(
    "entry", [{}, {"secretRef": {"name": "s"}, "configMapRef": {"name": "c"}}], ids=["none", "both"]
)
def test_malformed_env_from_is_refused(entry: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="exactly one of secretRef, configMapRef"):
        spec([], [entry])


def test_a_pool_template_takes_the_same_references_with_the_same_refusals() -> None:
    from sandlot.api.crdgen import crd_for
    from sandlot.api.pool import SandboxPool

    schema = crd_for(SandboxPool)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    template = schema["properties"]["spec"]["properties"]["template"]["properties"]["spec"]
    env_item = template["properties"]["env"]["items"]
    from_item = template["properties"]["envFrom"]["items"]
    assert "valueFrom" in env_item["properties"]
    rules = [r["rule"] for r in env_item["x-kubernetes-validations"]]
    rules += [r["rule"] for r in from_item["x-kubernetes-validations"]]
    assert any("valueFrom" in r and "value" in r for r in rules), rules
    assert any("secretRef" in r and "configMapRef" in r for r in rules), rules


def test_the_agent_reads_only_its_brokered_copy_and_waits_for_what_is_not_there() -> None:
    from sandlot.adapters.pullsecrets import reference_key
    from sandlot.agent.environment import Environment

    s = spec([{"name": "A", "value": "1"}, secret_key("PW", "db", "pw")])
    copy = {reference_key(NS, "secret", "db"): encode(Referenced(True, {"pw": "v"}))}
    assert Environment(lambda: copy).variables(NS, s) == ["A=1", "PW=v"]
    # Another namespace's entry of the same name is not this sandbox's.
    with pytest.raises(EnvReferenceMissing, match='secret "db" not yet available'):
        Environment(lambda: copy).variables("elsewhere", s)
    with pytest.raises(EnvReferenceMissing, match='secret "db" not yet available'):
        Environment(lambda: None).variables(NS, s)
