"""What a push sends: the blobs a manifest names, each once, capped."""

from __future__ import annotations

import pytest

from sandlot.adapters.pulling import RegistryError
from sandlot.adapters.pulling.push import MAX_PUSH_BLOBS, manifest_blobs
from sandlot.policy.pulling import FailureKind


def blob(n: int, size: int = 10) -> dict[str, object]:
    return {"digest": f"sha256:{n:064x}", "size": size}


def test_layers_go_first_the_config_last_each_once() -> None:
    manifest = {"config": blob(9, 3), "layers": [blob(1), blob(2), blob(1)]}
    assert manifest_blobs(manifest) == [
        (f"sha256:{1:064x}", 10),
        (f"sha256:{2:064x}", 10),
        (f"sha256:{9:064x}", 3),
    ]


@pytest.mark.parametrize(
    "entry",
    [{"digest": "md5:00", "size": 1}, {"digest": f"sha256:{1:064x}"}, {"size": 4}, blob(1, -1)],
)
def test_a_blob_without_digest_or_size_is_refused(entry: dict[str, object]) -> None:
    with pytest.raises(RegistryError):
        manifest_blobs({"config": blob(9), "layers": [entry]})


def test_more_blobs_than_the_cap_are_refused_before_any_request() -> None:
    manifest = {"config": blob(0), "layers": [blob(n + 1) for n in range(MAX_PUSH_BLOBS)]}
    with pytest.raises(RegistryError) as refused:
        manifest_blobs(manifest)
    assert refused.value.kind is FailureKind.TOO_LARGE
