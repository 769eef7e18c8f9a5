"""When kopf's lists count as in (sandlot.controllers.kopflisted): once every object
a list of our own found has been handed over, whatever became of it since."""

from __future__ import annotations

import asyncio

from sandlot.controllers.kopflisted import KopfListed

BOUND = 5.0  # seconds any run here may take


def run(listed: KopfListed, hand_over: list[tuple[str, str]] | None = None) -> None:
    """Run ``listed`` while "kopf" hands over one (plural, key) per loop turn."""

    async def main() -> None:
        task = asyncio.create_task(listed.run())
        for plural, key in hand_over or ():
            await asyncio.sleep(0.01)
            seen[plural].add(key)
        await asyncio.wait_for(task, BOUND)

    asyncio.run(main())


seen: dict[str, set[str]] = {}


def make(lists: dict[str, list[set[str] | Exception]], opened: list[int]) -> KopfListed:
    seen.clear()
    seen.update({plural: set() for plural in lists})

    def list_keys(plural: str) -> set[str]:
        answer = lists[plural].pop(0) if len(lists[plural]) > 1 else lists[plural][0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    return KopfListed(
        {plural: (lambda p=plural: seen[p]) for plural in lists},
        list_keys,
        on_listed=lambda: opened.append(1),
        relist=0.1,
        poll=0.005,
    )


def test_kinds_count_as_listed_once_every_listed_object_was_handed_over() -> None:
    opened: list[int] = []
    listed = make({"sandboxpools": [{"ns/a", "ns/b"}], "sandboxnodes": [{"n1"}]}, opened)
    assert listed.unlisted() == ["sandboxnodes", "sandboxpools"]
    run(listed, [("sandboxpools", "ns/a"), ("sandboxnodes", "n1"), ("sandboxpools", "ns/b")])
    assert listed.unlisted() == []
    assert opened == [1]


def test_an_object_deleted_before_kopf_saw_it_does_not_hold_the_kind_forever() -> None:
    opened: list[int] = []
    listed = make({"sandboxclaims": [{"ns/gone", "ns/kept"}, {"ns/kept"}]}, opened)
    run(listed, [("sandboxclaims", "ns/kept")])
    assert opened == [1], "the kind was listed again without the deleted object"


def test_a_failed_list_is_tried_again() -> None:
    opened: list[int] = []
    listed = make({"sandboxpools": [RuntimeError("API server away"), set()]}, opened)
    run(listed)
    assert opened == [1]


def test_nothing_opens_while_an_object_is_not_handed_over() -> None:
    opened: list[int] = []
    listed = make({"sandboxpools": [{"ns/a"}]}, opened)

    async def main() -> None:
        task = asyncio.create_task(listed.run())
        await asyncio.sleep(0.3)  # three re-lists
        assert not task.done()
        task.cancel()

    asyncio.run(main())
    assert opened == [] and listed.unlisted() == ["sandboxpools"]
