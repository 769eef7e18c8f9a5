"""When kopf's lists count as in (sandlot.controllers.kopflisted): once every object
a list of our own found has been handed over, whatever became of it since. "kopf"
hands over one object per wait of the waiter; time is a fake clock."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from functools import partial

from sandlot.controllers.kopflisted import KopfListed
from tests.support.clock import FakeClock

RELIST = 5.0
POLL = 0.2


class World:
    def __init__(
        self,
        lists: dict[str, list[set[str] | Exception]],
        hand_over: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.clock = FakeClock()
        self.lists = lists
        self.seen: dict[str, set[str]] = {plural: set() for plural in lists}
        self.hand_over: Iterator[tuple[str, str]] = iter(hand_over)
        self.opened = 0
        self.listings = 0
        self.listed = KopfListed(
            {plural: partial(self.seen.__getitem__, plural) for plural in lists},
            self.list_keys,
            on_listed=self.open,
            relist=RELIST,
            poll=POLL,
            clock=self.clock.monotonic,
            sleep=self.sleep,
        )

    def open(self) -> None:
        self.opened += 1

    def list_keys(self, plural: str) -> set[str]:
        self.listings += 1
        answers = self.lists[plural]
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def sleep(self, seconds: float) -> None:
        self.clock.advance(seconds)
        handed = next(self.hand_over, None)
        if handed is not None:
            self.seen[handed[0]].add(handed[1])

    def run(self, *, for_seconds: float = 60.0) -> bool:
        """Run until the kinds are listed (True) or ``for_seconds`` of fake time pass."""

        async def main() -> bool:
            task = asyncio.create_task(self.listed.run())
            start = self.clock.monotonic()
            while not task.done() and self.clock.monotonic() - start < for_seconds:
                await asyncio.sleep(0)
            if task.done():
                task.result()
                return True
            task.cancel()
            return False

        return asyncio.run(main())


def test_kinds_count_as_listed_once_every_listed_object_was_handed_over() -> None:
    w = World(
        {"sandboxpools": [{"ns/a", "ns/b"}], "sandboxnodes": [{"n1"}]},
        [("sandboxpools", "ns/a"), ("sandboxnodes", "n1"), ("sandboxpools", "ns/b")],
    )
    assert w.listed.unlisted() == ["sandboxnodes", "sandboxpools"]
    assert w.run()
    assert w.listed.unlisted() == []
    assert w.opened == 1


def test_an_object_deleted_before_kopf_saw_it_does_not_hold_the_kind_forever() -> None:
    w = World(
        {"sandboxclaims": [{"ns/gone", "ns/kept"}, {"ns/kept"}]}, [("sandboxclaims", "ns/kept")]
    )
    assert w.run()
    assert w.opened == 1 and w.listings == 2, "listed again, without the deleted object"


def test_a_failed_list_is_tried_again() -> None:
    w = World({"sandboxpools": [RuntimeError("API server away"), set()]})
    assert w.run()
    assert (w.opened, w.listings) == (1, 2)


def test_nothing_opens_while_a_listed_object_is_not_handed_over() -> None:
    w = World({"sandboxpools": [{"ns/a"}]})
    assert not w.run(for_seconds=3 * RELIST), "opened without the pool kopf never handed over"
    assert w.opened == 0 and w.listed.unlisted() == ["sandboxpools"]
    assert w.listings >= 3, "listed again every RELIST seconds"
