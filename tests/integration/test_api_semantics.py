"""What the API server itself enforces for sandlot's kinds, claimed against a real
kube-apiserver + etcd: schema errors, printer columns, server-side field
selection, terminal phases, and status writes that leave spec alone."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandlot.adapters.objects import Objects
from sandlot.api import GROUP, VERSION

pytestmark = pytest.mark.integration


def sandbox(name: str, **spec: object) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"image": "example.test/busybox:1", **spec},
    }


@pytest.fixture
def objs(kube: client.ApiClient) -> Any:
    return client.CustomObjectsApi(kube)  # custom objects: plain JSON


def create(objs: Any, ns: str, body: dict[str, Any]) -> dict[str, Any]:
    made: dict[str, Any] = objs.create_namespaced_custom_object(
        GROUP, VERSION, ns, "sandboxes", body
    )
    return made


def set_status(objs: Any, ns: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
    patched: dict[str, Any] = objs.patch_namespaced_custom_object_status(
        GROUP, VERSION, ns, "sandboxes", name, {"status": status}
    )
    return patched


def test_crds_are_served_with_short_names_and_category(kubectl):
    out = kubectl("api-resources", "--categories=sandlot", "-o", "name").stdout.split()
    assert sorted(out) == sorted(
        [
            "cacheprunes.sandlot.dev",
            "sandboxclaims.sandlot.dev",
            "sandboxes.sandlot.dev",
            "sandboxnodes.sandlot.dev",
            "sandboxpools.sandlot.dev",
            "sandboxsnapshots.sandlot.dev",
        ]
    )
    wide = kubectl("api-resources", "--api-group=sandlot.dev").stdout
    assert " sb " in wide and " snode " in wide and " sbpool " in wide and " sbclaim " in wide
    assert " sbsnap " in wide


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"image": ""}, "spec.image", "at least 1 chars"),
        ({"ports": [{"containerPort": 70000}]}, "spec.ports[0].containerPort", "65535"),
        ({"hostNetwork": "yes"}, "spec.hostNetwork", "boolean"),
        (
            {"resources": {"limits": {"memory": "lots"}}},
            "spec.resources.limits.memory",
            "should match",
        ),
        # Images sandlot committed are no tenant's to name: another namespace's
        # snapshot or suspended filesystem would run as if preloaded.
        (
            {"image": "sandlot.local/snapshots/6f1c2a-uid:latest"},
            "spec.image",
            "may not name an image sandlot committed",
        ),
        (
            {"image": "sandlot.local/suspended/6f1c2a-uid:latest"},
            "spec.image",
            "may not name an image sandlot committed",
        ),
        (
            {"image": "SANDLOT.LOCAL/snapshots/6f1c2a-uid"},
            "spec.image",
            "may not name an image sandlot committed",
        ),
        # A node name is a DNS subdomain: nothing the operator names after it escapes.
        ({"nodeName": "../n1"}, "spec.nodeName", "should match"),
        ({"nodeName": "N1_x"}, "spec.nodeName", "should match"),
    ],
    ids=[
        "empty-image",
        "port-out-of-range",
        "hostnetwork-not-bool",
        "memory-not-a-quantity",
        "snapshot-image",
        "suspended-image",
        "committed-image-in-capitals",
        "node-name-path",
        "node-name-not-dns",
    ],
)
def test_bad_spec_is_refused_with_a_message_naming_the_field(objs, namespace, spec, field, words):
    body = sandbox("bad")
    body["spec"].update(spec)
    with pytest.raises(ApiException) as err:
        create(objs, namespace, body)
    assert err.value.status == 422
    assert field in str(err.value.body) and words in str(err.value.body), err.value.body
    with pytest.raises(ApiException) as gone:
        objs.get_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxes", "bad")
    assert gone.value.status == 404, "a refused object must not be stored"


def test_a_pool_template_naming_a_committed_image_is_refused(objs, namespace):
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SandboxPool",
        "metadata": {"name": "thief"},
        "spec": {
            "replicas": 1,
            "template": {"spec": {"image": "sandlot.local/snapshots/6f1c2a-uid:latest"}},
        },
    }
    with pytest.raises(ApiException) as err:
        objs.create_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxpools", body)
    assert err.value.status == 422
    said = str(err.value.body)
    assert "spec.template.spec.image" in said, said
    assert "may not name an image sandlot committed" in said, said


def test_kubectl_get_sandboxes_prints_the_spec_columns(objs, namespace, kubectl):
    create(
        objs,
        namespace,
        {
            **sandbox("web-1", nodeName="n1"),
            "metadata": {"name": "web-1", "labels": {"sandlot.dev/pool": "web"}},
        },
    )
    set_status(objs, namespace, "web-1", {"phase": "Dead", "reason": "NodeLost", "ip": "10.9.0.7"})

    lines = kubectl("get", "sandboxes", "-n", namespace).stdout.splitlines()
    assert lines[0].split() == ["NAME", "PHASE", "NODE", "IP", "AGE"]
    assert lines[1].split()[:4] == ["web-1", "Dead", "n1", "10.9.0.7"]

    wide = kubectl("get", "sb", "-n", namespace, "-o", "wide").stdout.splitlines()
    assert wide[0].split() == [
        "NAME",
        "PHASE",
        "NODE",
        "IP",
        "AGE",
        "POOL",
        "MODE",
        "READY",
        "REASON",
        "SHUTDOWN-TIME",
        "ACTIVE-DEADLINE",
    ]
    # No Ready condition (no probe) and no lifetime: blank columns.
    assert wide[1].split()[5:] == ["web", "Running", "NodeLost"]


def test_kubectl_get_snode_prints_the_spec_columns(kube, kubectl):
    objs = client.CustomObjectsApi(kube)
    objs.create_cluster_custom_object(
        GROUP,
        VERSION,
        "sandboxnodes",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SandboxNode",
            "metadata": {"name": "cols-n1"},
        },
    )
    try:
        objs.patch_cluster_custom_object_status(
            GROUP,
            VERSION,
            "sandboxnodes",
            "cols-n1",
            {"status": {"phase": "Ready", "sandboxes": 3}},
        )
        lines = kubectl("get", "snode", "cols-n1").stdout.splitlines()
        assert lines[0].split() == ["NAME", "PHASE", "SANDBOXES", "AGE"]
        assert lines[1].split()[:3] == ["cols-n1", "Ready", "3"]
    finally:
        objs.delete_cluster_custom_object(GROUP, VERSION, "sandboxnodes", "cols-n1")


def test_field_selector_on_node_name_filters_server_side(objs, namespace, kubectl):
    for name, node in [("a", "n1"), ("b", "n2"), ("c", "n1"), ("d", None)]:
        create(objs, namespace, sandbox(name, **({"nodeName": node} if node else {})))

    listed = objs.list_namespaced_custom_object(
        GROUP, VERSION, namespace, "sandboxes", field_selector="spec.nodeName=n1"
    )
    assert sorted(i["metadata"]["name"] for i in listed["items"]) == ["a", "c"]

    out = kubectl(
        "get", "sb", "-n", namespace, "--field-selector", "spec.nodeName=n2", "-o", "name"
    ).stdout.split()
    assert out == ["sandbox.sandlot.dev/b"]

    # A field the CRD does not declare selectable is refused, proving the filter above
    # was applied by the server and not ignored.
    with pytest.raises(ApiException) as err:
        objs.list_namespaced_custom_object(
            GROUP, VERSION, namespace, "sandboxes", field_selector="spec.image=x"
        )
    assert err.value.status == 400


def test_a_nodes_sandboxes_come_in_pages_or_whole_selected_by_the_server(kube, objs, namespace):
    node, other = f"pages-{namespace}", f"other-{namespace}"
    mine = {f"s{i}" for i in range(5)}
    for name in sorted(mine):
        create(objs, namespace, sandbox(name, nodeName=node))
    create(objs, namespace, sandbox("elsewhere", nodeName=other))

    pages, token = [], None
    for _ in range(len(mine) + 1):  # bounded: one more request than sandboxes
        page, token = Objects(kube).node_sandboxes_page(node, 2, token)
        pages.append(sorted(i["metadata"]["name"] for i in page))
        if token is None:
            break
    assert token is None, f"still paging after {len(pages)} pages: {pages}"
    assert [len(p) for p in pages] == [2, 2, 1]
    assert {name for p in pages for name in p} == mine
    whole = Objects(kube).list_node_sandboxes(node)
    assert {i["metadata"]["name"] for i in whole} == mine


@pytest.mark.parametrize("terminal", ["Dead", "Stopped", "Failed"])
def test_terminal_phase_cannot_be_left(objs, namespace, terminal):
    create(objs, namespace, sandbox("s", nodeName="n1"))
    set_status(objs, namespace, "s", {"phase": "Running"})
    set_status(objs, namespace, "s", {"phase": terminal})
    with pytest.raises(ApiException) as err:
        set_status(objs, namespace, "s", {"phase": "Running"})
    assert err.value.status == 422
    assert "terminal" in str(err.value.body)
    current = objs.get_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxes", "s")
    assert current["status"]["phase"] == terminal
    # Same phase with new detail is still allowed (a reaper adding the exit code).
    set_status(objs, namespace, "s", {"phase": terminal, "message": "more detail"})


def test_status_patch_leaves_spec_untouched(objs, namespace):
    created = create(objs, namespace, sandbox("hn", nodeName="n1", hostNetwork=True))
    patched = set_status(objs, namespace, "hn", {"phase": "Dead", "reason": "NodeLost"})
    assert patched["spec"] == created["spec"]
    assert patched["spec"]["hostNetwork"] is True
    assert patched["metadata"]["generation"] == created["metadata"]["generation"]


def test_status_is_ignored_on_the_main_resource(objs, namespace):
    create(objs, namespace, sandbox("st", nodeName="n1"))
    body = objs.get_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxes", "st")
    body["status"] = {"phase": "Running"}
    updated = objs.replace_namespaced_custom_object(
        GROUP, VERSION, namespace, "sandboxes", "st", body
    )
    assert "phase" not in updated.get("status", {}), "status must only change via /status"


def test_node_name_is_immutable_once_set(objs, namespace):
    create(objs, namespace, sandbox("pinned", nodeName="n1"))
    with pytest.raises(ApiException) as err:
        objs.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "sandboxes", "pinned", {"spec": {"nodeName": "n2"}}
        )
    assert err.value.status == 422 and "immutable" in str(err.value.body)


def test_snapshot_ref_is_immutable_and_a_snapshots_node_once_set(objs, namespace):
    create(objs, namespace, sandbox("forked", snapshotRef={"name": "s1"}))
    create(objs, namespace, sandbox("plain"))
    for name, spec in (
        ("forked", {"snapshotRef": {"name": "s2"}}),
        ("forked", {"snapshotRef": None}),
        ("plain", {"snapshotRef": {"name": "s1"}}),
    ):
        with pytest.raises(ApiException) as err:
            objs.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, "sandboxes", name, {"spec": spec}
            )
        assert err.value.status == 422 and "snapshotRef is immutable" in str(err.value.body), name
    snap = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SandboxSnapshot",
        "metadata": {"name": "s1"},
        "spec": {"sandboxName": "forked", "nodeName": "n1"},
    }
    objs.create_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxsnapshots", snap)
    for change in ({"nodeName": "n2"}, {"sandboxName": "plain"}):
        with pytest.raises(ApiException) as err:
            objs.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, "sandboxsnapshots", "s1", {"spec": change}
            )
        assert err.value.status == 422 and "immutable" in str(err.value.body), change


def test_snapshot_printer_columns(objs, namespace, kubectl):
    snap = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SandboxSnapshot",
        "metadata": {"name": "shown"},
        "spec": {"sandboxName": "prep", "nodeName": "n1"},
    }
    objs.create_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxsnapshots", snap)
    status = {
        "phase": "Ready",
        "reason": "Taken",
        "imageRef": "sandlot.local/snapshots/u:latest",
        "digest": "sha256:" + "a" * 64,
        "sizeBytes": 6291456,
    }
    objs.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "sandboxsnapshots", "shown", {"status": status}
    )
    narrow = kubectl("get", "sbsnap", "-n", namespace).stdout.splitlines()
    assert narrow[0].split() == ["NAME", "SANDBOX", "PHASE", "NODE", "SIZE", "AGE"]
    assert narrow[1].split()[:5] == ["shown", "prep", "Ready", "n1", "6291456"]
    wide = kubectl("get", "sbsnap", "-n", namespace, "-o", "wide").stdout.splitlines()
    assert wide[0].split()[-3:] == ["IMAGE", "DIGEST", "REASON"]
    assert wide[1].split()[-3:] == [status["imageRef"], status["digest"], "Taken"]


def test_node_name_moves_only_while_a_pushed_state_is_recorded(objs, namespace):
    create(objs, namespace, sandbox("moved", nodeName="n1"))
    state = {"image": "r.example/s:u@sha256:" + "0" * 64, "digest": "sha256:" + "0" * 64}
    # The main resource cannot record it: its status is the subresource's.
    with pytest.raises(ApiException) as err:
        objs.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "sandboxes",
            "moved",
            {"spec": {"nodeName": "n2"}, "status": {"suspendedState": {**state, "node": "n1"}}},
        )
    assert err.value.status == 422 and "immutable" in str(err.value.body)
    set_status(
        objs, namespace, "moved", {"phase": "Running", "suspendedState": {**state, "node": "n1"}}
    )
    moved = objs.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "sandboxes", "moved", {"spec": {"nodeName": "n2"}}
    )
    assert moved["spec"]["nodeName"] == "n2"
    with pytest.raises(ApiException) as err:  # bound it stays: only a change is allowed
        objs.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "sandboxes", "moved", {"spec": {"nodeName": None}}
        )
    assert err.value.status == 422


def test_stale_resource_version_gets_a_conflict(objs, namespace):
    created = create(objs, namespace, sandbox("rv", nodeName="n1"))
    set_status(objs, namespace, "rv", {"phase": "Running"})
    stale = {
        "metadata": {"resourceVersion": created["metadata"]["resourceVersion"]},
        "status": {"phase": "Dead"},
    }
    with pytest.raises(ApiException) as err:
        objs.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, "sandboxes", "rv", stale
        )
    assert err.value.status == 409
