"""A forced image GC pass over N images, against a ``ctr images rm`` loop and bare deletes.

Starts a private containerd and imports N small distinct images (one archive, one
``ctr import``) into a fresh namespace, then times ``ImageCollector.run_forced()``
there: list containers and images, plan, N deletes (records only), one garbage
collection, measure the disk. The bytes the pass freed are also measured as the
bytes of containerd's root directory before and after (the collector's own figure
comes from the filesystem, which other processes write to as well).

Then, each in a fresh namespace holding the same images (imported after the
previous one emptied its namespace and its content was collected, so no blob is
shared):

- ``ctr -a ADDR -n NS images rm NAME``, one process per image as an operator
  would type it (``ctr`` does not wait for a garbage collection);
- a bare gRPC loop of ``Images.Delete`` without sync, one call per image, then
  one collection (``collect_garbage``): what containerd itself needs to free the
  space, the floor of any pass that deletes one record at a time.

Rows: pass / ctr loop (target <= 0.3), and the pass's ms per image over the bare
loop's (target <= 1.25: the pass also lists containers and images, reading each
image's manifest from the content store, and measures the disk twice).

    sudo .venv/bin/python bench/gc_forced.py [--images 300] [--json rows.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.containerd import start_private_containerd
from tests.support.image_sets import allocated_bytes, build_image_set, import_image_set

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.agent.imagegc import GcOutcome, ImageCollector, disk_usage_of

TARGET_VS_CTR = 0.3
TARGET_VS_BARE = 1.25


class TimedCalls:
    """The runtime, with the time spent in each method added up (where a pass's time goes)."""

    def __init__(self, inner: ContainerdRuntime) -> None:
        self._inner = inner
        self.seconds: dict[str, float] = defaultdict(float)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - began

        return timed


def imported(address: str, namespace: str, archive: Path) -> None:
    """Import the set, then flush it to disk: the deletes' commits (fsync) would
    otherwise pay for writing back the import, and only the first loop would."""
    import_image_set(address, namespace, archive, timeout=600)
    os.sync()


def row(name: str, value: float, target: str, ok: bool, detail: str) -> dict[str, Any]:
    print(f"  {name}: {value:.4g} (target {target}) {'ok' if ok else 'MISSED'} - {detail}")
    return {
        "benchmark": name,
        "value": round(value, 4),
        "target": target,
        "ok": ok,
        "detail": detail,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    n = args.images
    names = [f"docker.io/sandlot/bench-gc-{i:04d}:1" for i in range(n)]

    work = Path(tempfile.mkdtemp(prefix="sl-bench-gc-"))
    started = time.monotonic()
    archive = build_image_set(work / "images.tar", names, filler_bytes=4096)
    print(f"built {n} images in {time.monotonic() - started:.1f}s", flush=True)
    containerd = start_private_containerd()
    try:
        ns = f"bench-gc-{uuid.uuid4().hex[:6]}"
        imported(containerd.address, ns, archive)
        with ContainerdRuntime(containerd.address, ns) as rt:
            assert len(rt.list_images(timeout=60)) == n
            timed = TimedCalls(rt)
            collector = ImageCollector(
                timed,  # type: ignore[arg-type]
                lambda: disk_usage_of(str(containerd.root)),
                call_timeout=60,
            )
            root_before = allocated_bytes(containerd.root)
            t0 = time.monotonic()
            result = collector.run_forced()
            forced = time.monotonic() - t0
            root_freed = root_before - allocated_bytes(containerd.root)
            left = len(rt.list_images(timeout=60))
        if result.outcome is not GcOutcome.OK or result.records_removed != n or left:
            print(f"forced pass did not remove everything: {result} ({left} left)")
            return 1

        ns2 = f"bench-ctr-{uuid.uuid4().hex[:6]}"
        imported(containerd.address, ns2, archive)
        addr = shlex.quote(containerd.address)
        script = "\n".join(
            f"ctr -a {addr} -n {ns2} images rm {shlex.quote(name)} >/dev/null" for name in names
        )
        t0 = time.monotonic()
        subprocess.run(["sh", "-e", "-c", script], check=True, timeout=900)
        loop = time.monotonic() - t0
        with ContainerdRuntime(containerd.address, ns2) as rt2:
            left = len(rt2.list_images(timeout=60))
            rt2.collect_garbage(timeout=120)
        if left:
            print(f"ctr loop left {left} images")
            return 1

        ns3 = f"bench-bare-{uuid.uuid4().hex[:6]}"
        imported(containerd.address, ns3, archive)
        with ContainerdRuntime(containerd.address, ns3) as rt3:
            rt3.version(timeout=10)  # the channel is connected before the clock starts
            root_before = allocated_bytes(containerd.root)
            t0 = time.monotonic()
            for name in names:
                rt3.delete_image(name, timeout=30)
            deletes = time.monotonic() - t0
            rt3.collect_garbage(timeout=120)
            bare = time.monotonic() - t0
            bare_freed = root_before - allocated_bytes(containerd.root)
            left = len(rt3.list_images(timeout=60))
        if left:
            print(f"bare delete loop left {left} images")
            return 1
    finally:
        containerd.stop()
        containerd.remove()

    spent = ", ".join(f"{k} {1000 * v:.0f} ms" for k, v in sorted(timed.seconds.items()))
    print(
        f"forced pass over {n} images: {forced:.2f}s ({1000 * forced / n:.1f} ms/image); "
        f"freed {result.bytes_freed} bytes on the filesystem, {root_freed} bytes of "
        f"containerd's root; in calls: {spent}"
    )
    print(f"ctr images rm loop over {n} images: {loop:.2f}s ({1000 * loop / n:.1f} ms/image)")
    print(
        f"bare Images.Delete loop over {n} images: {deletes:.2f}s "
        f"({1000 * deletes / n:.2f} ms/image), then one collection: {bare:.2f}s "
        f"({1000 * bare / n:.2f} ms/image); freed {bare_freed} bytes of containerd's root"
    )
    vs_ctr, vs_bare = forced / loop, forced / bare
    print(f"ratio forced/ctr: {vs_ctr:.2f}")
    rows = [
        row(
            f"forced GC pass, {n} images / ctr images rm loop",
            vs_ctr,
            f"<= {TARGET_VS_CTR}",
            vs_ctr <= TARGET_VS_CTR,
            f"{forced:.2f}s vs {loop:.2f}s; freed {root_freed} bytes of containerd's root "
            f"(measured after the collection)",
        ),
        row(
            f"forced GC pass ms/image / bare gRPC deletes + one collection, {n} images",
            vs_bare,
            f"<= {TARGET_VS_BARE}",
            vs_bare <= TARGET_VS_BARE,
            f"{1000 * forced / n:.2f} vs {1000 * bare / n:.2f} ms/image (deletes alone "
            f"{1000 * deletes / n:.2f}); pass's calls: {spent}",
        ),
    ]
    if args.json:
        args.json.write_text(json.dumps(rows))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
