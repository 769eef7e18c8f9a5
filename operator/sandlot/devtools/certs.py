"""Certificates for the local rigs, made with ``openssl``: a CA and leaves it signs.

Three CAs matter on the stream path: the API server's front-proxy CA (its client
certificate when it proxies to an aggregated API), the gateway's own CA (the
gateway's certificate) and sandlot's agent CA (each agent's serving certificate,
naming its node). A cluster gets the same from the chart
(``templates/stream-gateway.yaml``) and the operator; the rigs make them here.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sandlot.policy.agentcerts import agent_server_name

KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
DAYS = "365"


def _openssl(*args: str) -> None:
    if shutil.which("openssl") is None:
        raise RuntimeError("'openssl' is needed to make the rig's certificates and is missing")
    proc = subprocess.run(
        ["openssl", *args], capture_output=True, text=True, timeout=60, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {args[0]}: {proc.stderr.strip()}")


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class CA:
    pair: Pair

    @property
    def cert(self) -> Path:
        return self.pair.cert

    @classmethod
    def create(cls, directory: Path, name: str) -> CA:
        """A self-signed CA ``name`` (reused when its files exist)."""
        directory.mkdir(parents=True, exist_ok=True)
        pair = Pair(directory / f"{name}.crt", directory / f"{name}.key")
        if not pair.cert.exists():
            _openssl(
                "req", "-x509", *KEY, "-keyout", str(pair.key), "-out", str(pair.cert),
                "-days", DAYS, "-subj", f"/CN={name}",
                "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            )  # fmt: skip
        return cls(pair)

    def issue(
        self,
        directory: Path,
        common_name: str,
        *,
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
        file_name: str = "",
    ) -> Pair:
        """A certificate for ``common_name`` (server and client use) signed by this CA."""
        directory.mkdir(parents=True, exist_ok=True)
        stem = file_name or common_name
        pair = Pair(directory / f"{stem}.crt", directory / f"{stem}.key")
        csr = directory / f"{stem}.csr"
        ext = directory / f"{stem}.ext"
        sans = [f"DNS:{d}" for d in dns] + [f"IP:{i}" for i in ips]
        lines = [
            "basicConstraints=CA:FALSE",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            "extendedKeyUsage=serverAuth,clientAuth",
        ]
        if sans:
            lines.append("subjectAltName=" + ",".join(sans))
        ext.write_text("\n".join(lines) + "\n")
        _openssl(
            "req", "-new", *KEY, "-keyout", str(pair.key), "-out", str(csr),
            "-subj", f"/CN={common_name}",
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(self.pair.cert),
            "-CAkey", str(self.pair.key), "-CAcreateserial", "-out", str(pair.cert),
            "-days", DAYS, "-extfile", str(ext),
        )  # fmt: skip
        csr.unlink()
        ext.unlink()
        return pair


GATEWAY_NAME = "sandlot-gateway"
AGENT_NAME = "sandlot-agent"


@dataclass(frozen=True)
class StreamCerts:
    """The stream path's certificates, as a cluster has them: the gateway's own CA
    (the gateway's certificate, the only client CA the agents trust) and sandlot's
    agent CA (one certificate per node, ``agent(node)``, as the operator signs them;
    the only CA the gateway trusts for agents). ``front_proxy`` is a client
    certificate of the gateway's CA, for rigs that stand in for the API server."""

    ca: CA
    gateway: Pair
    agent_ca: CA
    front_proxy: Pair
    directory: Path

    @classmethod
    def create(cls, directory: Path, namespace: str, ips: tuple[str, ...] = ()) -> StreamCerts:
        ca = CA.create(directory, "sandlot-stream-gateway-ca")
        gateway = ca.issue(
            directory,
            GATEWAY_NAME,
            dns=(
                f"{GATEWAY_NAME}.{namespace}.svc",
                f"{GATEWAY_NAME}.{namespace}.svc.cluster.local",
            ),
            ips=ips,
        )
        agent_ca = CA.create(directory, "sandlot-agent-ca")
        front_proxy = ca.issue(directory, "stream-front-proxy")
        return cls(ca, gateway, agent_ca, front_proxy, directory)

    def agent(self, node: str) -> Pair:
        """Node ``node``'s agent certificate (made once), named as the operator names it."""
        where = self.directory / "agents"
        pair = Pair(where / f"{node}.crt", where / f"{node}.key")
        if pair.cert.exists():
            return pair
        return self.agent_ca.issue(
            where, AGENT_NAME, dns=(agent_server_name(node),), file_name=node
        )


FRONT_PROXY_NAME = "front-proxy-client"


def front_proxy_flags(certs: Path) -> list[str]:
    """kube-apiserver's front proxy, as kubeadm configures it: how it reaches
    aggregated APIs (sandlot's stream gateway) and names the user to them. Without
    kube-proxy here, it dials an APIService's endpoints, not its cluster IP."""
    ca = CA.create(certs, "front-proxy-ca")
    client = ca.issue(certs, FRONT_PROXY_NAME, file_name="front-proxy-client")
    return [
        f"--requestheader-client-ca-file={ca.cert}",
        f"--requestheader-allowed-names={FRONT_PROXY_NAME}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={client.cert}",
        f"--proxy-client-key-file={client.key}",
        "--enable-aggregator-routing=true",
    ]


__all__ = ["AGENT_NAME", "CA", "GATEWAY_NAME", "Pair", "StreamCerts", "front_proxy_flags"]
