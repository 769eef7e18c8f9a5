"""A forced image GC pass over N images against a plain ``ctr images rm`` loop.

Starts a private containerd, imports N small distinct images (one archive, one
``ctr import``) into a fresh namespace, and times ``ImageCollector.run_forced()``
there: list containers and images, plan, N synchronous deletes (content gone on
return), measure the disk. Then imports the same images into another fresh
namespace of the same containerd and times a shell loop of
``ctr -a ADDR -n NS images rm NAME``, one process per image as an operator would
type it. Prints both times and their ratio (target: at most 1.2).

``ctr images rm`` does not wait for containerd's garbage collector; the pass
does (``sync``), so the loop is the cheaper of the two by construction.

    sudo .venv/bin/python bench/gc_forced.py [--images 300]
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.containerd import start_private_containerd
from tests.support.image_sets import build_image_set, import_image_set

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.agent.imagegc import GcOutcome, ImageCollector, disk_usage_of

TARGET_RATIO = 1.2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=300)
    args = parser.parse_args()
    names = [f"docker.io/sandlot/bench-gc-{i:04d}:1" for i in range(args.images)]

    work = Path(tempfile.mkdtemp(prefix="sl-bench-gc-"))
    started = time.monotonic()
    archive = build_image_set(work / "images.tar", names, filler_bytes=4096)
    print(f"built {len(names)} images in {time.monotonic() - started:.1f}s")
    containerd = start_private_containerd()
    try:
        ns = f"bench-gc-{uuid.uuid4().hex[:6]}"
        import_image_set(containerd.address, ns, archive, timeout=300)
        with ContainerdRuntime(containerd.address, ns) as rt:
            assert len(rt.list_images(timeout=60)) == len(names)
            collector = ImageCollector(
                rt, lambda: disk_usage_of(str(containerd.root)), call_timeout=30
            )
            t0 = time.monotonic()
            result = collector.run_forced()
            forced = time.monotonic() - t0
            left = len(rt.list_images(timeout=60))
        if result.outcome is not GcOutcome.OK or result.records_removed != len(names) or left:
            print(f"forced pass did not remove everything: {result} ({left} left)")
            return 1

        ns2 = f"bench-ctr-{uuid.uuid4().hex[:6]}"
        import_image_set(containerd.address, ns2, archive, timeout=300)
        addr = shlex.quote(containerd.address)
        script = "\n".join(
            f"ctr -a {addr} -n {ns2} images rm {shlex.quote(n)} >/dev/null" for n in names
        )
        t0 = time.monotonic()
        subprocess.run(["sh", "-e", "-c", script], check=True, timeout=600)
        loop = time.monotonic() - t0
        with ContainerdRuntime(containerd.address, ns2) as rt2:
            left = len(rt2.list_images(timeout=60))
        if left:
            print(f"ctr loop left {left} images")
            return 1
    finally:
        containerd.stop()
        containerd.remove()

    ratio = forced / loop
    print(
        f"forced pass over {len(names)} images: {forced:.2f}s "
        f"({1000 * forced / len(names):.1f} ms/image, freed {result.bytes_freed} bytes)"
    )
    print(f"ctr images rm loop over {len(names)} images: {loop:.2f}s")
    verdict = "ok" if ratio <= TARGET_RATIO else "over target"
    print(f"ratio forced/ctr: {ratio:.2f} (target <= {TARGET_RATIO}): {verdict}")
    return 0 if ratio <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
