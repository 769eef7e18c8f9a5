"""An image's manifests and configs kept by digest (``adapters.containerd.documents``):
bytes read once per digest, the least recently used dropped past a byte budget."""

from __future__ import annotations

from sandlot.adapters.containerd.documents import Documents


def test_a_digest_read_once_is_kept_as_its_bytes() -> None:
    documents = Documents(budget=100)
    assert documents.get("sha256:a") is None
    documents.put("sha256:a", b'{"config": {}}')
    assert documents.get("sha256:a") == b'{"config": {}}'


def test_past_the_budget_the_least_recently_used_go_first() -> None:
    documents = Documents(budget=30)
    documents.put("sha256:a", b"a" * 10)
    documents.put("sha256:b", b"b" * 10)
    documents.put("sha256:c", b"c" * 10)
    assert documents.get("sha256:a") is not None  # used: now the most recent
    documents.put("sha256:d", b"d" * 10)
    assert documents.get("sha256:b") is None
    assert [documents.get(d) is not None for d in ("sha256:a", "sha256:c", "sha256:d")] == [
        True,
        True,
        True,
    ]
    assert len(documents) == 3


def test_a_document_larger_than_the_budget_is_not_kept() -> None:
    documents = Documents(budget=10)
    documents.put("sha256:small", b"s" * 5)
    documents.put("sha256:huge", b"h" * 11)
    assert documents.get("sha256:huge") is None
    assert documents.get("sha256:small") == b"s" * 5


def test_the_same_digest_put_again_counts_once() -> None:
    documents = Documents(budget=20)
    documents.put("sha256:a", b"a" * 10)
    documents.put("sha256:a", b"a" * 10)
    documents.put("sha256:b", b"b" * 10)
    assert len(documents) == 2
    assert documents.get("sha256:a") is not None
