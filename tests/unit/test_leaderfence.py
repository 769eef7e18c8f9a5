"""The leader fence as data (the chart's copy, what it matches, what it says), and
the operator's answer to its refusal: resent while it still leads, never after."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubernetes.client.rest import RESTResponse
from urllib3 import HTTPResponse

from sandlot.adapters.kube import (
    NotLeader,
    RequestCounter,
    ServerFenced,
    WriteFence,
    _through_server_fence,
)
from sandlot.api.leaderfence import (
    CHART_TEMPLATE,
    HOLDER_RULE,
    LEADER_ONLY_RESOURCES,
    chart_template,
    leader_fence_policy,
    refused_as_non_holder,
)
from sandlot.api.writepolicy import Identities

ROOT = Path(__file__).resolve().parents[2]
IDS = Identities("sl-sandlot", "ns", "sl-sandlot-agent", "sl-sandlot-operator", "leader")
HOLDER_REFUSAL = (
    "ValidatingAdmissionPolicy 'sl-sandlot-leader-fence' with binding 'sl-sandlot-leader-fence' "
    f"denied request: sl-sandlot-leader-fence: rule {HOLDER_RULE}: only the holder of Lease "
    "ns/leader writes; it is held by op-b, refused update sandboxes/status w/s1 from pod op-a"
)


def test_committed_leader_fence_template_matches_the_policy() -> None:
    committed = (ROOT / CHART_TEMPLATE).read_text()
    assert committed == chart_template(), (
        f"{CHART_TEMPLATE} is out of date; regenerate with `sandlot gen admission` and commit it"
    )


def test_the_binding_takes_the_leader_lease_and_stands_aside_without_it() -> None:
    policy, binding = leader_fence_policy(IDS)
    assert policy["spec"]["paramKind"] == {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease"}
    assert binding["spec"]["paramRef"] == {
        "name": "leader",
        "namespace": "ns",
        "parameterNotFoundAction": "Allow",
    }
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username == '{IDS.operator_user}'"


def test_the_fence_matches_leader_writes_but_never_the_lease_or_a_node_itself() -> None:
    (policy, _) = leader_fence_policy(IDS)
    resources = [
        r for rule in policy["spec"]["matchConstraints"]["resourceRules"] for r in rule["resources"]
    ]
    assert set(LEADER_ONLY_RESOURCES) <= set(resources)
    assert {"services", "endpointslices"} <= set(resources)
    assert "leases" not in resources
    assert "sandboxnodes" not in resources  # kopf's finalizer, from every replica
    assert "events" not in resources


def test_every_rule_names_the_policy_and_itself() -> None:
    (policy, _) = leader_fence_policy(IDS)
    messages = [v["messageExpression"] for v in policy["spec"]["validations"]]
    assert len(messages) == 2
    for message, rule in zip(messages, ("operator-bound-token", HOLDER_RULE), strict=True):
        assert message.startswith(f"'sl-sandlot-leader-fence: rule {rule}: "), message


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (HOLDER_REFUSAL, True),
        (HOLDER_REFUSAL.replace(HOLDER_RULE, "operator-bound-token"), False),
        ("sl-sandlot-operator-writes: rule operator-managed-services: refused", False),
        ("", False),
    ],
    ids=["holder-rule", "bound-token-rule", "another-policy", "empty"],
)
def test_only_the_holder_rule_is_a_handover_refusal(message: str, expected: bool) -> None:
    assert refused_as_non_holder(message) is expected


class Server:
    """Answers ``send()`` with the given responses in order, as the REST client
    returns them (an error response is not raised until the API reads it)."""

    def __init__(self, *responses: RESTResponse) -> None:
        self.responses = list(responses)
        self.sent = 0

    def __call__(self) -> RESTResponse:
        self.sent += 1
        return self.responses.pop(0)


def response(message: str = HOLDER_REFUSAL, status: int = 403) -> RESTResponse:
    body = json.dumps({"kind": "Status", "message": message}).encode()
    return RESTResponse(HTTPResponse(body=body, status=status, preload_content=True))


OK = 200


def through(server: Server, leading: list[bool], counter: RequestCounter, waits: list[float]):
    fence = WriteFence(lambda: leading[0])
    return _through_server_fence(
        fence, server, "PATCH /x", counter, "PATCH", "/x", delays=(0.05, 0.1), sleep=waits.append
    )


def test_a_leader_refused_at_the_handover_resends_until_admitted() -> None:
    admitted = response("{}", status=OK)
    waits: list[float] = []
    server, counter = Server(response(), response(), admitted), RequestCounter()
    assert through(server, [True], counter, waits) is admitted
    assert (server.sent, waits) == (3, [0.05, 0.1])
    assert counter.fenced[("PATCH", "/x")] == 2


def test_a_deposed_leader_refused_by_the_server_does_not_resend() -> None:
    waits: list[float] = []
    server, counter = Server(response(), response("{}", status=OK)), RequestCounter()
    with pytest.raises(ServerFenced) as info:
        through(server, [False], counter, waits)
    assert isinstance(info.value, NotLeader)
    assert f"rule {HOLDER_RULE}" in str(info.value)
    assert (server.sent, waits) == (1, [])
    assert counter.fenced[("PATCH", "/x")] == 1


def test_a_refusal_that_outlasts_every_wait_is_raised() -> None:
    waits: list[float] = []
    server, counter = Server(response(), response(), response()), RequestCounter()
    with pytest.raises(ServerFenced):
        through(server, [True], counter, waits)
    assert (server.sent, waits) == (3, [0.05, 0.1])


@pytest.mark.parametrize(
    "answer",
    [
        response("sl-sandlot-operator-writes: rule operator-managed-services: x"),
        response(status=409),
        response("{}", status=OK),
    ],
    ids=["another-403", "conflict", "admitted"],
)
def test_other_answers_pass_through_unchanged(answer: RESTResponse) -> None:
    waits: list[float] = []
    server, counter = Server(answer), RequestCounter()
    assert through(server, [True], counter, waits) is answer
    assert (server.sent, waits, sum(counter.fenced.values())) == (1, [], 0)
