"""``sandlot dev cluster up|down``: the local cluster in the background, with the
pause and sandlot images imported into every node, ready for ``helm install``."""

from __future__ import annotations

from pathlib import Path

from sandlot.devtools.cluster import LocalCluster
from sandlot.devtools.cluster.images import PAUSE_IMAGE, pause_archive, sandlot_archive

IMAGE = "sandlot.local/sandlot:dev"


def repo_root() -> Path:
    return Path(__file__).resolve().parents[4]


def up(directory: str, nodes: int) -> int:
    workdir = Path(directory).resolve()
    if LocalCluster.from_state(workdir) is not None:
        down(directory)
    print(f"building (or finding cached) images and binaries; cluster under {workdir} ...")
    image = sandlot_archive(repo_root(), IMAGE)
    cluster = LocalCluster(workdir, node_count=nodes, images=[image])
    cluster.start(pause_archive(), PAUSE_IMAGE, detach=True)
    print(f"cluster up: {', '.join(n.name for n in cluster.nodes)} Ready; image {IMAGE}")
    print("next:")
    print(f"  export KUBECONFIG={cluster.kubeconfig}")
    print(
        "  helm install sandlot charts/sandlot -n sandlot-system --create-namespace "
        "--set image.repository=sandlot.local/sandlot,image.tag=dev,image.pullPolicy=Never"
    )
    print(f"stop it with: sandlot dev cluster down --dir {directory}")
    return 0


def down(directory: str) -> int:
    cluster = LocalCluster.from_state(Path(directory))
    if cluster is None:
        print("nothing was running")
        return 0
    cluster.stop()
    print(f"stopped the cluster under {Path(directory).resolve()}")
    return 0
