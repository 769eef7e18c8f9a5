"""Image pull throughput of the agent's puller against ``ctr images pull`` of the
same image from the same registry, as a ratio of their times (target <= 1.2).

Starts a private containerd and a registry on loopback (docker-registry), pushes
one image of a chosen size with skopeo (a busybox layer plus a filler layer of
random bytes, gzip-compressed, so the bytes travel and unpack as a real image's
do), then pulls it ``--rounds`` times with each, into fresh containerd
namespaces (nothing shared in the content store or snapshotter between rounds),
and compares the medians.

    sudo .venv/bin/python bench/pull.py [--mib 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.containerd import start_private_containerd

from sandlot.adapters.pulling import ContainerdPuller, Endpoint
from sandlot.devtools.ociarchive import build_image_archive
from sandlot.devtools.registry import LOOPBACK_HOSTS, start_registry, unavailable_reason
from sandlot.policy.pulling import RegistryAccess, parse_reference

TARGET_RATIO = 1.2


def _ctr_pull(address: str, namespace: str, ref: str) -> float:
    argv = ["ctr", "--address", address, "--namespace", namespace, "images", "pull"]
    argv += ["--plain-http", "--snapshotter", "overlayfs", ref]
    began = time.monotonic()
    subprocess.run(argv, check=True, capture_output=True, timeout=600)
    return time.monotonic() - began


def _our_pull(address: str, namespace: str, ref: str) -> float:
    puller = ContainerdPuller(
        address, namespace, access=RegistryAccess(private_hosts=frozenset(LOOPBACK_HOSTS))
    )
    parsed = parse_reference(ref)
    try:
        began = time.monotonic()
        puller.pull(
            ref, parsed, [Endpoint(f"http://{parsed.registry}")], None, deadline=600, labels={}
        )
        return time.monotonic() - began
    finally:
        puller.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64, help="filler layer size")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason:
        print(f"skipped: {reason}")
        return 1
    work = Path(tempfile.mkdtemp(prefix="sl-bench-pull-"))
    registry = start_registry(work / "registry")
    try:
        archive = work / "image.tar"
        ref = registry.ref("bench/pull:1")
        filler = {"/filler.bin": os.urandom(args.mib * 1024 * 1024)}
        build_image_archive(archive, ref, extra_files=filler, compress=True)
        registry.push(archive, "bench/pull:1", timeout=600)
        ours: list[float] = []
        theirs: list[float] = []
        for i in range(args.rounds):
            # A fresh containerd for every pull: its content store is shared across
            # namespaces, so a second pull into the same daemon fetches nothing.
            # Who goes first alternates, so the registry's page cache favours neither.
            pair = [(theirs, _ctr_pull), (ours, _our_pull)]
            for times, pull in pair if i % 2 == 0 else pair[::-1]:
                containerd = start_private_containerd()
                try:
                    times.append(pull(containerd.address, f"bench-{uuid.uuid4().hex[:6]}", ref))
                finally:
                    containerd.stop()
                    containerd.remove()
        a, b = statistics.median(ours), statistics.median(theirs)
        ratio = a / b
        verdict = "ok" if ratio <= TARGET_RATIO else "MISSED"
        print(
            f"pull of {args.mib} MiB: sandlot {a:.2f}s, ctr {b:.2f}s "
            f"(medians of {args.rounds}; {args.mib / a:.1f} vs {args.mib / b:.1f} MiB/s)"
        )
        print(f"ratio sandlot/ctr: {ratio:.3f} (target <= {TARGET_RATIO}) {verdict}")
        return 0 if ratio <= TARGET_RATIO else 1
    finally:
        registry.stop()


if __name__ == "__main__":
    sys.exit(main())
