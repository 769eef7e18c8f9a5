"""Marking a node's sandboxes: a first page whose marks go out while the rest of the
node is listed whole (never by a continue token), and a listing that stops part-way
leaves the latch unset."""

from __future__ import annotations

import threading
from typing import Any

from kubernetes.client.exceptions import ApiException

from tests.unit.test_nodehealth_controller import GRACE, World, lost

WAIT = 10.0  # seconds a listing waits for a mark from the page before it


def test_a_node_larger_than_a_page_is_listed_whole_after_it_and_each_sandbox_marked_once() -> None:
    w = World()
    first = w.ctl.marker.first_page
    size = first + 100
    keys = w.sandboxes("n1", size)
    lost(w)
    w.clock.advance(GRACE)
    w.step()
    assert [w.objects.phase(k) for k in keys] == ["Dead"] * size
    assert w.health("n1")["handledCount"] == size
    assert w.objects.pages == [("n1", first, first), ("n1", None, size)]
    assert w.objects.continued == [], "the rest was asked for by the page's continue token"


def test_a_sandbox_of_the_first_page_still_live_in_the_whole_listing_is_marked_once() -> None:
    w = World()
    size = w.ctl.marker.first_page + 100
    keys = w.sandboxes("n1", size)
    lost(w)
    w.clock.advance(GRACE)
    whole_listed = threading.Event()
    listing, writing = w.objects.list_node_sandboxes, w.objects.patch_sandbox_status

    def list_then_release(node: str) -> Any:
        answer = listing(node)
        whole_listed.set()
        return answer

    def write_after_the_whole_listing(*args: Any, **kwargs: Any) -> Any:
        # The first page's marks land only once the whole listing was taken, so it
        # still lists every one of them Running.
        assert whole_listed.wait(WAIT), f"the whole listing never came ({WAIT:.0f}s)"
        return writing(*args, **kwargs)

    w.objects.list_node_sandboxes = list_then_release  # type: ignore[method-assign]
    w.objects.patch_sandbox_status = write_after_the_whole_listing  # type: ignore[method-assign]
    w.step()
    marked = [key for verb, key in w.objects.writes if verb == "patch-status"]
    assert sorted(marked) == sorted(keys), (
        f"{len(marked) - len(set(marked))} sandboxes of the first page were marked twice"
    )
    assert [w.objects.phase(k) for k in keys] == ["Dead"] * size


def test_the_first_pages_marks_are_written_before_the_next_page_is_listed() -> None:
    w = World()
    keys = w.sandboxes("n1", w.ctl.marker.first_page + w.ctl.settings.mark_concurrency)
    lost(w)
    w.clock.advance(GRACE)
    written = threading.Event()
    listings: list[bool] = []  # per page: had a mark been written when it was listed?

    def on_write(verb: str, key: str) -> None:
        if verb == "patch-status":
            written.set()

    def on_list(node: str) -> None:
        if listings:  # the second page waits, bounded, for a mark from the first
            listings.append(written.wait(WAIT))
        else:
            listings.append(written.is_set())

    w.objects.before_write = on_write
    w.objects.on_list = on_list
    w.step()
    assert listings == [False, True], (
        f"the second page was listed before any of the first page's marks was written "
        f"(waited {WAIT:.0f}s): the listing ran ahead of the marks"
    )
    assert [w.objects.phase(k) for k in keys] == ["Dead"] * len(keys)


def test_leadership_lost_between_pages_stops_after_the_marks_already_sent() -> None:
    w = World()
    first = w.ctl.marker.first_page
    keys = w.sandboxes("n1", first + 100)
    lost(w)
    w.clock.advance(GRACE)

    def lose_on_the_second_page(node: str) -> None:
        if len(w.objects.pages) == 1:
            w.leader = False

    w.objects.on_list = lose_on_the_second_page
    w.step()
    assert len(w.objects.pages) == 2, "it went on listing after losing the leadership"
    assert sum(w.objects.phase(k) == "Dead" for k in keys) == first
    assert "handledAt" not in w.health("n1")


def test_a_listing_that_fails_part_way_leaves_the_latch_unset_and_the_retry_marks_the_rest() -> (
    None
):
    w = World()
    first = w.ctl.marker.first_page
    keys = w.sandboxes("n1", first + 100)
    lost(w)
    w.clock.advance(GRACE)

    def fail_the_second_page(node: str) -> None:
        if len(w.objects.pages) == 1:
            raise ApiException(status=500, reason="injected listing failure")

    w.objects.on_list = fail_the_second_page
    w.step()
    assert sum(w.objects.phase(k) == "Dead" for k in keys) == first
    assert "handledAt" not in w.health("n1")
    retry = w.due_in("n1")
    assert retry is not None, "a failed listing was not retried"
    w.objects.on_list = None
    w.clock.advance(retry)
    w.step()
    assert [w.objects.phase(k) for k in keys] == ["Dead"] * len(keys)
    assert w.health("n1")["handledAt"]


def test_a_node_that_renews_while_it_is_marked_stops_the_pass_within_the_writes_in_flight() -> None:
    w = World()
    keys = w.sandboxes("n1", 1000)
    lost(w)
    w.clock.advance(GRACE)
    renew_at = 100
    writes: list[str] = []
    lock = threading.Lock()

    def on_write(verb: str, key: str) -> None:
        if verb != "patch-status":
            return
        with lock:
            writes.append(key)
            renew = len(writes) == renew_at
        if renew:
            w.renew("n1")  # observed from a write thread, as from the lease watch's

    w.objects.before_write = on_write
    w.step()
    assert len(writes) >= renew_at, "the renewal was never injected"
    after = len(writes) - renew_at
    assert after < w.ctl.settings.mark_concurrency, f"{after} marks sent after the renewal"
    assert "handledAt" not in w.health("n1"), "a stopped pass set the latch"
    assert ("n1", "MarkingStopped") in w.events
    w.ctl.enqueue("n1")  # the resync timer: the revived node's next pass
    assert w.step() == ["n1"], "the revived node's next pass never ran"
    assert w.objects.nodes["n1"]["status"]["phase"] == "Ready"
    live = sum(w.objects.phase(k) == "Running" for k in keys)
    assert live == len(keys) - len(writes), "sandboxes left alone were marked later"
