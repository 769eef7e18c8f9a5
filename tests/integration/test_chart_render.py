"""The Helm chart rendered by the real helm: lint, the objects of the defaults and of
every optional feature, every setting of both programs a value reaching its
variable, bad values refused naming the value, and kubectl finding the plugin."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from sandlot.agent.metrics import AgentMetrics, GcMetrics
from sandlot.agent.settings import AgentSettings
from sandlot.api.settings import setting_fields
from sandlot.cli.options import env_name, settings_from
from sandlot.controllers.metrics import OperatorMetrics
from sandlot.controllers.settings import OperatorSettings
from sandlot.devtools.controlplane import kubectl_path
from tests.support.chart import (
    CHART,
    by_kind,
    helm,
    hook_of,
    render,
    run_helm,
)

__all__ = ["helm"]  # fixtures

pytestmark = pytest.mark.integration


def container_env(workload: dict[str, Any]) -> dict[str, Any]:
    """The container's environment; downward-API values become their field path."""
    env = {}
    for item in workload["spec"]["template"]["spec"]["containers"][0]["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            env[item["name"]] = "<" + item["valueFrom"]["fieldRef"]["fieldPath"] + ">"
    return env


ALL_ON = (
    "--set",
    "metrics.serviceMonitor.enabled=true,prometheusRule.enabled=true,"
    "grafanaDashboard.enabled=true,agent.cni.mount=true,agent.privileged=true",
)


def test_helm_lint_strict_passes(helm: Path) -> None:
    proc = run_helm(helm, "lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in proc.stdout


def test_defaults_render_the_operator_agent_rbac_services_and_pdb(helm: Path) -> None:
    docs = [d for d in render(helm) if not hook_of(d)]
    kinds = sorted(d["kind"] for d in docs)
    for kind in ("Deployment", "DaemonSet", "PodDisruptionBudget", "ClusterRole", "Role"):
        assert kind in kinds
    assert kinds.count("ServiceAccount") == 3 and kinds.count("Service") == 3
    assert not {"ServiceMonitor", "PrometheusRule", "ConfigMap"} & set(kinds), "optional ones on"

    deploy, gateway = sorted(
        by_kind(docs, "Deployment"), key=lambda d: d["metadata"]["name"].endswith("-gateway")
    )
    assert gateway["spec"]["template"]["spec"]["containers"][0]["args"] == ["gateway"]
    pod = deploy["spec"]["template"]["spec"]
    assert deploy["spec"]["replicas"] == 2
    (op,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    sc = op["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"] and sc["privileged"] is False
    assert op["livenessProbe"]["httpGet"]["port"] == "metrics"
    assert op["readinessProbe"]["httpGet"]["port"] == "metrics"
    # Liveness and readiness are different checks (sandlot.policy.probes).
    assert op["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert op["startupProbe"]["httpGet"]["path"] == "/livez"
    assert op["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert op["resources"]["requests"] and op["args"] == ["operator"]
    assert op["resources"]["requests"]["ephemeral-storage"]
    assert op["resources"]["limits"]["ephemeral-storage"]

    (ds,) = by_kind(docs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    assert not pod.get("hostPID") and not pod.get("hostNetwork")
    # Files reach sandboxes through the tool mounted in them, not the node's /proc.
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["SANDLOT_FILES_TOOL"] == "/opt/sandlot/libexec/sandlot-files"
    assert env["SANDLOT_PROC_ROOT"] == "/proc"
    assert "host-proc" not in {v["name"] for v in pod["volumes"]}
    assert {"operator": "Exists"} in pod["tolerations"], "the agent must tolerate every taint"
    assert agent["securityContext"]["privileged"] is False
    assert agent["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert agent["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert agent["startupProbe"]["httpGet"]["path"] == "/livez"
    assert agent["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert agent["resources"]["requests"]["ephemeral-storage"]
    assert agent["resources"]["limits"]["ephemeral-storage"]
    policies = {
        p["metadata"]["labels"]["app.kubernetes.io/component"]
        for p in by_kind(docs, "NetworkPolicy")
    }
    assert policies == {"operator", "agent", "gateway", "cleanup"}, "every pod has its policy"
    env = container_env(ds)
    assert env["SANDLOT_NODE_NAME"] == "<spec.nodeName>"
    paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert paths == {
        "containerd-socket": "/run/containerd",
        "containerd-root": "/var/lib/containerd",
        "containerd-config": "/etc/containerd",  # its CRI runtimes: the node's handlers
        "sandbox-logs": "/var/log/sandlot",
        "host-cgroup": "/sys/fs/cgroup",
        "agent-state": "/var/lib/sandlot",  # the node lock: on the node's disk
    }
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    assert mounts["containerd-root"]["readOnly"] is True
    assert mounts["containerd-config"]["readOnly"] is True
    assert env["SANDLOT_CONTAINERD_CONFIG"] == "/etc/containerd/config.toml"
    assert mounts["host-cgroup"]["readOnly"] is True
    assert env["SANDLOT_CGROUP_ROOT"] == mounts["host-cgroup"]["mountPath"]

    (pdb,) = by_kind(docs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1


def test_every_setting_of_both_programs_is_a_value_reaching_its_variable(helm: Path) -> None:
    docs = render(helm)
    for kind, model in (("Deployment", OperatorSettings), ("DaemonSet", AgentSettings)):
        env = container_env(by_kind(docs, kind)[0])
        wanted = {env_name(f) for f in setting_fields(model)}
        assert set(env) == wanted, (
            f"{kind}: missing {wanted - set(env)}, unknown {set(env) - wanted}"
        )


def test_rendered_values_are_accepted_by_the_programs_settings(helm: Path, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "operator": {"gracePeriod": "45s", "disruptionThreshold": 0.4},
                "agent": {
                    "killWait": "3s",
                    "gc": {
                        "enabled": False,
                        "highThresholdPercent": 90,
                        "minFreeBytes": 10 * 1024**3,
                        "targetFreeBytes": 20 * 1024**3,
                        "pinnedImages": ["a.test/x:1", "b.test/y:2"],
                    },
                },
            }
        )
    )
    docs = render(helm, "-f", str(values))
    empty = argparse.Namespace()
    op = settings_from(
        OperatorSettings, empty, environ=container_env(by_kind(docs, "Deployment")[0])
    )
    assert op.node_health.grace_period == timedelta(seconds=45)
    assert op.guard.disruption_threshold == 0.4
    assert op.namespace == "sandlot-system"
    agent = settings_from(
        AgentSettings, empty, environ=container_env(by_kind(docs, "DaemonSet")[0])
    )
    assert agent.kill_wait == timedelta(seconds=3) and agent.gc_disabled is True
    assert agent.gc_high == 90 and agent.gc_min_free == 10 * 1024**3
    assert agent.gc_target_free == 20 * 1024**3
    assert agent.pinned_images == ("a.test/x:1", "b.test/y:2", "ghcr.io/sandlot/sandlot:0.1.0")


def test_every_optional_feature_renders(helm: Path) -> None:
    docs = render(helm, *ALL_ON)
    kinds = [d["kind"] for d in docs]
    assert kinds.count("ServiceMonitor") == 2 and kinds.count("PrometheusRule") == 1
    (cm,) = by_kind(docs, "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["sandlot.json"])
    titles = {p["title"] for p in dashboard["panels"]}
    for wanted in ("Nodes by phase", "Sandboxes by phase", "Teardown kill-wait timeouts"):
        assert wanted in titles
    (rule,) = by_kind(docs, "PrometheusRule")
    alerts = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert alerts == [
        "SandlotMassFailureHoldActive",
        "SandlotGuardHoldingTooLong",
        "SandlotTeardownKillWaitTimeouts",
        "SandlotImageGcExhausted",
    ]
    (ds,) = by_kind(docs, "DaemonSet")
    assert ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privileged"]
    names = {v["name"] for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert {"cni-conf", "cni-bin"} <= names


def test_every_ipam_state_dir_is_the_nodes_writable_at_its_own_path(helm: Path) -> None:
    """The agent runs the network's IPAM plugins: each directory they keep allocations
    in (host-local's default, or a dataDir such as kindnet's) is the node's own,
    writable, at the path the network's configuration names."""
    dirs = ["/var/lib/cni", "/run/cni-ipam-state"]
    values = ("--set", "agent.privileged=true,agent.cni.mount=true")
    listed = ("--set-json", f"agent.cni.stateDirs={json.dumps(dirs)}")
    for args, wanted in (((*values,), dirs[:1]), ((*values, *listed), dirs)):
        (ds,) = by_kind(render(helm, *args), "DaemonSet")
        pod = ds["spec"]["template"]["spec"]
        host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
        mounts = {
            m["mountPath"]: m
            for m in pod["containers"][0]["volumeMounts"]
            if m["name"].startswith("cni-state")
        }
        assert sorted(mounts) == sorted(wanted), mounts
        for path, mount in mounts.items():
            assert host[mount["name"]] == path and not mount.get("readOnly"), mount


def _exported_metric_names() -> set[str]:
    registry = CollectorRegistry()
    OperatorMetrics(registry)
    AgentMetrics(registry)
    GcMetrics(registry)
    names: set[str] = set()
    for family in registry.collect():
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
        names.update(family.name + s for s in suffixes.get(family.type, [""]))
    return names


def test_dashboard_and_alerts_use_only_metrics_the_programs_export(helm: Path) -> None:
    docs = render(helm, *ALL_ON)
    (cm,) = by_kind(docs, "ConfigMap")
    (rule,) = by_kind(docs, "PrometheusRule")
    exprs = [
        t["expr"] for p in json.loads(cm["data"]["sandlot.json"])["panels"] for t in p["targets"]
    ]
    exprs += [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    used = {m for e in exprs for m in re.findall(r"\bsandlot_[a-z_]+", e)}
    assert used and used <= _exported_metric_names(), used - _exported_metric_names()


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"operator": {"gracePeriod": "5 minutes"}}, "operator.gracePeriod"),
        ({"operator": {"disruptionThreshold": 1.5}}, "operator.disruptionThreshold"),
        ({"operator": {"replicas": 0}}, "operator.replicas"),
        ({"operator": {"gracePerod": "3s"}}, "gracePerod"),
        ({"agent": {"gc": {"highThresholdPercent": 101}}}, "agent.gc.highThresholdPercent"),
        ({"agent": {"gc": {"lowThresholdPercent": 90}}}, "agent.gc.lowThresholdPercent"),
        ({"agent": {"renewInterval": "90s"}}, "agent.renewInterval"),
        ({"agent": {"teardownConcurrency": "eight"}}, "agent.teardownConcurrency"),
        ({"agent": {"containerdAddress": "run/containerd.sock"}}, "agent.containerdAddress"),
        ({"admissionPolicy": {"defaultLevel": "lax"}}, "admissionPolicy.defaultLevel"),
        ({"agent": {"cni": {"mount": True}}}, "agent.privileged"),
        ({"agent": {"hostProc": True}}, "agent.privileged"),
        ({"gateway": {"maxSessions": 0}}, "gateway.maxSessions"),
        (
            {"agent": {"updateStrategy": {"rollingUpdate": {"maxSurge": 1}}}},
            "agent.updateStrategy.rollingUpdate.maxSurge",
        ),
        (
            {"agent": {"sandboxNetworkPolicy": {"blockedEgress": ["metadata"]}}},
            "agent.sandboxNetworkPolicy.blockedEgress",
        ),
        (
            {"agent": {"sandboxNetworkPolicy": {"reservedPorts": [0]}}},
            "agent.sandboxNetworkPolicy.reservedPorts",
        ),
        ({"agent": {"runtimes": {"hostDir": "var/lib/x"}}}, "agent.runtimes.hostDir"),
        (
            {"agent": {"runtimes": {"gvisor": {"runscConfig": {"debug": 'x" y'}}}}},
            "agent.runtimes.gvisor.runscConfig",
        ),
        ({"agent": {"runtimes": {"gvisor": {"install": "yes"}}}}, "agent.runtimes.gvisor.install"),
        ({"agent": {"cni": {"stateDirs": ["run/cni-ipam-state"]}}}, "agent.cni.stateDirs"),
    ],
    ids=[
        "duration-without-unit-syntax",
        "threshold-above-one",
        "no-operator-replica",
        "misspelt-setting",
        "gc-high-above-100",
        "gc-low-not-below-high",
        "renew-not-below-lease",
        "concurrency-not-a-number",
        "relative-socket-path",
        "unknown-policy-level",
        "cni-mount-without-privileged",
        "host-proc-without-privileged",
        "no-stream-sessions",
        "agent-surge",
        "blocked-egress-not-a-cidr",
        "reserved-port-zero",
        "runtimes-dir-relative",
        "runsc-flag-with-a-quote",
        "gvisor-install-not-a-boolean",
        "cni-state-dir-relative",
    ],
)
def test_bad_values_are_refused_naming_the_value(
    helm: Path, tmp_path: Path, values: dict[str, Any], named: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(values))
    proc = run_helm(helm, "template", "sl", str(CHART), "-f", str(path), check=False)
    assert proc.returncode != 0, f"{values} was accepted"
    # The schema names a value by its path (/agent/gc/x), the chart's checks by dots.
    assert named in proc.stderr.replace("/", "."), proc.stderr


def test_kubectl_finds_the_sandlot_plugin(tmp_path: Path) -> None:
    venv_bin = Path(sys.executable).parent
    assert (venv_bin / "kubectl-sandlot").exists(), f"no kubectl-sandlot in {venv_bin}"
    env = dict(os.environ, PATH=f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}")
    env["KUBECONFIG"] = str(tmp_path / "none")
    plugins = subprocess.run(
        [str(kubectl_path()), "plugin", "list"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert str(venv_bin / "kubectl-sandlot") in plugins.stdout, plugins.stdout + plugins.stderr
    proc = subprocess.run(
        [str(kubectl_path()), "sandlot", "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "usage: sandlot" in proc.stdout and "operator" in proc.stdout


def _mounted(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, set[str]]:
    """The Secret keys each volume of workload ``kind``/``name`` mounts, by Secret."""
    (workload,) = [d for d in by_kind(docs, kind) if d["metadata"]["name"] == name]
    seen: dict[str, set[str]] = {}
    for volume in workload["spec"]["template"]["spec"]["volumes"]:
        sources = (
            [volume] if "secret" in volume else (volume.get("projected") or {}).get("sources", [])
        )
        for source in sources:
            secret = source.get("secret")
            if secret:
                name_ = secret.get("secretName") or secret.get("name")
                keys = {i["key"] for i in secret.get("items") or ()} or {"*"}
                seen.setdefault(name_, set()).update(keys)
    return seen


def test_each_stream_party_trusts_only_its_peers_own_ca(helm: Path) -> None:
    """The gateway CA issues the gateway's certificate alone and is the agents' only
    client CA; the agent CA's key is the operator's alone; no agent holds a key made
    elsewhere (each makes its own and asks the operator for its node's certificate)."""
    made = render(helm)
    secrets = {d["metadata"]["name"]: d for d in by_kind(made, "Secret")}
    gateway, agent_ca = secrets["sl-sandlot-stream-gateway"], secrets["sl-sandlot-agent-ca"]
    assert gateway["data"]["ca.crt"] != agent_ca["data"]["tls.crt"], "one CA for both sides"
    assert "sl-sandlot-stream-agent" not in secrets, "a shared agent key is still made"
    (api_service, *_) = by_kind(made, "APIService")
    assert api_service["spec"]["caBundle"] == gateway["data"]["ca.crt"]
    assert _mounted(made, "DaemonSet", "sl-sandlot-agent") == {
        "sl-sandlot-stream-gateway": {"ca.crt"}
    }
    assert _mounted(made, "Deployment", "sl-sandlot-gateway") == {
        "sl-sandlot-stream-gateway": {"*"},
        "sl-sandlot-agent-ca": {"tls.crt"},
    }
    assert _mounted(made, "Deployment", "sl-sandlot-operator") == {"sl-sandlot-agent-ca": {"*"}}
    (agent,) = by_kind(made, "DaemonSet")
    env = {
        e["name"]: e.get("value") for e in agent["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["SANDLOT_STREAM_TLS_REQUEST"] == "true"
    assert env["SANDLOT_STREAM_CLIENT_CA"].endswith("/gateway-ca.crt")


def test_the_stream_certificates_come_from_the_chart_or_from_cert_manager(helm: Path) -> None:
    managed = render(helm, "--set", "streamCerts.certManager.enabled=true")
    assert not [s for s in by_kind(managed, "Secret") if "stream" in s["metadata"]["name"]]
    certs = {c["spec"]["secretName"]: c["spec"] for c in by_kind(managed, "Certificate")}
    assert certs["sl-sandlot-stream-gateway"]["commonName"] == "sandlot-gateway"
    assert "client auth" in certs["sl-sandlot-stream-gateway"]["usages"]
    assert certs["sl-sandlot-agent-ca"]["isCA"] and certs["sl-sandlot-stream-gateway-ca"]["isCA"]
    # The gateway's name comes from an Issuer of the release's own, in its namespace,
    # whose CA issues nothing else; nothing is issued for the agents but their CA.
    assert certs["sl-sandlot-stream-gateway"]["issuerRef"] == {
        "name": "sl-sandlot-stream-gateway-ca",
        "kind": "Issuer",
        "group": "cert-manager.io",
    }
    issuers = {i["metadata"]["name"]: i["spec"] for i in by_kind(managed, "Issuer")}
    assert issuers["sl-sandlot-stream-gateway-ca"] == {
        "ca": {"secretName": "sl-sandlot-stream-gateway-ca"}
    }
    assert set(certs) == {
        "sl-sandlot-stream-gateway",
        "sl-sandlot-stream-gateway-ca",
        "sl-sandlot-agent-ca",
    }
    (injected, *_) = by_kind(managed, "APIService")
    assert "caBundle" not in injected["spec"]
    assert injected["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].endswith(
        "/sl-sandlot-stream-gateway"
    )


def test_a_shared_issuer_for_the_gateways_name_is_refused(helm: Path) -> None:
    """Anyone who may ask a shared (Cluster)Issuer for a certificate could mint
    sandlot-gateway from it: naming one is refused, not quietly ignored."""
    refused = run_helm(
        helm, "template", "sl", str(CHART), "--namespace", "sandlot-system",
        "--set", "streamCerts.certManager.enabled=true",
        "--set", "streamCerts.certManager.issuerRef.name=corp-ca",
        "--set", "streamCerts.certManager.issuerRef.kind=ClusterIssuer",
        check=False,
    )  # fmt: skip
    assert refused.returncode != 0, "a shared issuer was accepted"
    assert "streamCerts.certManager.issuerRef" in refused.stderr, refused.stderr


GVISOR_ON = (
    "--set",
    "agent.runtimes.gvisor.install=true,agent.nodeSelector.pool=sandboxes,"
    "agent.runtimes.gvisor.nodeSelector.containerd=v2,"
    "agent.runtimes.gvisor.runscConfig.platform=systrap",
)


def _installer(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (installer,) = [
        d for d in by_kind(docs, "DaemonSet") if d["metadata"]["name"].endswith("-gvisor")
    ]
    return installer


def test_gvisor_is_installed_only_where_its_value_says_and_the_agent_reads_it(helm: Path) -> None:
    off = render(helm)
    assert [d["metadata"]["name"] for d in by_kind(off, "DaemonSet")] == ["sl-sandlot-agent"]
    assert not by_kind(off, "RuntimeClass")
    assert container_env(by_kind(off, "DaemonSet")[0])["SANDLOT_RUNTIMES_DIR"] == ""

    docs = render(helm, *GVISOR_ON)
    agent = next(d for d in by_kind(docs, "DaemonSet") if d["metadata"]["name"].endswith("-agent"))
    pod = _installer(docs)["spec"]["template"]["spec"]
    # The agent's nodes that the value selects, tolerating what the agent tolerates.
    assert pod["nodeSelector"] == {"pool": "sandboxes", "containerd": "v2"}
    assert pod["tolerations"] == agent["spec"]["template"]["spec"]["tolerations"]
    assert pod["automountServiceAccountToken"] is False, "the installer needs no API identity"
    (install,) = pod["containers"]
    assert install["image"] == "ghcr.io/sandlot/sandlot-runtimes:0.1.0"
    sc = install["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"] and sc["readOnlyRootFilesystem"] is True
    assert [v["hostPath"]["path"] for v in pod["volumes"]] == ["/var/lib/sandlot-runtimes"]
    # The agent: the fragments' directory, the host directory read-only at its own path.
    assert container_env(agent)["SANDLOT_RUNTIMES_DIR"] == "/var/lib/sandlot-runtimes/conf.d"
    spec = agent["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
    assert mounts["runtimes"] == {
        "name": "runtimes", "mountPath": "/var/lib/sandlot-runtimes", "readOnly": True
    }  # fmt: skip
    (rc,) = by_kind(docs, "RuntimeClass")
    assert rc["metadata"]["name"] == "gvisor" and rc["handler"] == "gvisor"
    # Matched against the Kubernetes Nodes' labels, it confirms the handler each node
    # publishes (a node's own word is not enough: policy/nodetrust.py).
    assert rc["scheduling"] == {"nodeSelector": {"containerd": "v2"}}, rc
    no_class = render(helm, *GVISOR_ON, "--set", "agent.runtimes.gvisor.runtimeClass.create=false")
    assert not by_kind(no_class, "RuntimeClass")


def test_gvisor_gets_a_loopback_of_its_own_unless_cni_gives_it_a_network(helm: Path) -> None:
    def script(*values: str) -> str:
        pod = _installer(render(helm, *GVISOR_ON, *values))["spec"]["template"]["spec"]
        return str(pod["containers"][0]["args"][0])

    assert 'network = "none"' in script()
    cni = ("--set", "agent.privileged=true,agent.cni.mount=true")
    assert "network =" not in script(*cni)
    chosen = script("--set", "agent.runtimes.gvisor.runscConfig.network=host")
    assert 'network = "host"' in chosen and 'network = "none"' not in chosen


def test_the_installer_writes_what_the_agent_offers_and_removes_it_when_stopped(
    helm: Path, tmp_path: Path
) -> None:
    """The installer's own script, run by busybox in a root of its own (its image's
    layout: /bin/busybox, /gvisor/bin; the host directory at /host-runtimes): the
    fragment it writes is a handler the agent offers, with the shim's path and its
    options file, which names runsc and the flags; a SIGTERM removes it all."""
    import signal
    import stat
    import time
    import tomllib

    from sandlot.agent.runtimes import discover

    (script,) = _installer(render(helm, *GVISOR_ON))["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    root, host = tmp_path / "root", tmp_path / "root" / "host-runtimes"
    for d in ("bin", "dev", "gvisor/bin", "host-runtimes"):
        (root / d).mkdir(parents=True, exist_ok=True)
    os.mknod(root / "dev" / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # as a runtime gives
    (root / "bin" / "busybox").write_bytes(Path("/bin/busybox").read_bytes())
    (root / "bin" / "busybox").chmod(0o755)
    for b in ("runsc", "containerd-shim-runsc-v1"):
        (root / "gvisor" / "bin" / b).write_text(f"#!{b}\n")
    proc = subprocess.Popen(["chroot", str(root), "/bin/busybox", "sh", "-c", script])
    try:
        fragment = host / "conf.d" / "gvisor.toml"
        deadline = time.monotonic() + 30
        while not fragment.exists():
            assert proc.poll() is None, f"the installer exited ({proc.returncode})"
            assert time.monotonic() < deadline, "the installer wrote no fragment within 30s"
            time.sleep(0.1)
        # Paths in the fragment are the node's (hostDir): seen here under host/.
        offered = discover(
            str(tmp_path / "absent.toml"),
            str(host / "conf.d"),
            lambda p: (host / Path(p).relative_to("/var/lib/sandlot-runtimes")).is_file(),
        )
        handler = offered.get("gvisor")
        assert handler is not None, offered
        assert handler.shim == "/var/lib/sandlot-runtimes/gvisor/bin/containerd-shim-runsc-v1"
        assert handler.config_path == "/var/lib/sandlot-runtimes/gvisor/runsc.toml"
        options = tomllib.loads((host / "gvisor" / "runsc.toml").read_text())
        assert options == {  # no CNI: gVisor's own loopback, nothing else
            "binary_name": "/var/lib/sandlot-runtimes/gvisor/bin/runsc",
            "runsc_config": {"network": "none", "platform": "systrap"},
        }
        assert (host / "gvisor" / "bin" / "runsc").read_text() == "#!runsc\n"
        assert os.access(host / "gvisor" / "bin" / "runsc", os.X_OK)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert not list(host.iterdir()), sorted(str(p) for p in host.rglob("*"))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
