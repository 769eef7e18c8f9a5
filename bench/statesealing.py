"""What sealing pushed state costs: a push and a pull of the same image sealed under
a key (``adapters.pulling.sealed``) against the plain push and pull, in one run.

Starts a private containerd and a registry on loopback, imports an image whose
second layer holds ``--mib`` MiB, then ``--rounds`` times: pushes it plain to a fresh
repository and sealed to another (a fresh repository links no blob, so every blob
is sent), and pulls each into a fresh containerd namespace (content fetched and
unpacked). Prints the medians and the ratios. Figures from one run on one machine:
compare the rows of a run, not runs.

    sudo .venv/bin/python bench/statesealing.py [--mib 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.containerd import start_private_containerd

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.deadline import Deadline
from sandlot.adapters.pulling import ContainerdPuller, Endpoint, RegistryClient, push_image
from sandlot.adapters.pulling.sealed import KEY_BYTES, SealedPuller, push_sealed
from sandlot.adapters.runtime import RuntimeTimeout
from sandlot.devtools.ociarchive import build_image_archive, import_archive
from sandlot.devtools.registry import LOOPBACK_HOSTS, start_registry
from sandlot.policy.pulling import RegistryAccess, parse_reference

IMAGE = "docker.io/sandlot/sealbench:1"
ACCESS = RegistryAccess(private_hosts=frozenset(LOOPBACK_HOSTS))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="sl-bench-seal-"))
    containerd = start_private_containerd()
    registry = start_registry(work / "registry")
    source = f"bench-seal-{uuid.uuid4().hex[:6]}"
    rt = ContainerdRuntime(containerd.address, source)
    key = os.urandom(KEY_BYTES)
    endpoint = Endpoint(f"http://{registry.host}")
    times: dict[str, list[float]] = {"push": [], "push sealed": [], "pull": [], "pull sealed": []}
    try:
        build_image_archive(work / "image.tar", IMAGE, filler_bytes=args.mib << 20, salt="seal")
        import_archive(containerd.address, source, work / "image.tar", timeout=300)
        manifest, media_type = rt.image_manifest(IMAGE, timeout=30)

        def open_blob(digest: str) -> Iterator[bytes]:
            return rt.open_blob(digest, timeout=300)

        def client(repository: str) -> RegistryClient:
            return RegistryClient(
                endpoint,
                repository,
                None,
                connect_timeout=5,
                stall_timeout=30,
                deadline=Deadline(600, expired=RuntimeTimeout),
                access=ACCESS,
            )

        for i in range(args.rounds):
            started = time.perf_counter()
            pushed = push_image(client(f"bench/plain{i}"), "t", manifest, media_type, open_blob)
            times["push"].append(time.perf_counter() - started)
            started = time.perf_counter()
            boxed = push_sealed(
                client(f"bench/sealed{i}"), "t", manifest, media_type, open_blob, key
            )
            times["push sealed"].append(time.perf_counter() - started)
            plain_puller = ContainerdPuller(
                containerd.address,
                f"bench-plain-{i}",
                stall_timeout=30,
                transfer=False,
                access=ACCESS,
            )
            sealed_puller = SealedPuller(
                containerd.address,
                f"bench-sealed-{i}",
                stall_timeout=30,
                transfer=False,
                access=ACCESS,
            )
            try:
                started = time.perf_counter()
                plain_puller.pull(
                    IMAGE,
                    parse_reference(pushed.reference),
                    [endpoint],
                    None,
                    deadline=600,
                    labels={},
                )
                times["pull"].append(time.perf_counter() - started)
                started = time.perf_counter()
                sealed_puller.pull_sealed(
                    IMAGE, parse_reference(boxed.reference), [endpoint], None, key, deadline=600
                )
                times["pull sealed"].append(time.perf_counter() - started)
            finally:
                plain_puller.close()
                sealed_puller.close()
    finally:
        rt.close()
        registry.stop()
        containerd.stop()
    print(f"state sealing, an image of {args.mib} MiB + busybox, {args.rounds} rounds (median s):")
    for kind, values in times.items():
        print(f"  {kind:<12} {statistics.median(values):7.3f}")
    for kind in ("push", "pull"):
        ratio = statistics.median(times[f"{kind} sealed"]) / statistics.median(times[kind])
        print(f"  {kind} sealed / plain: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
