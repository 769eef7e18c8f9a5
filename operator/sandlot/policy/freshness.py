"""Which view of one object a watch-fed cache keeps, when resourceVersions may be
compared for equality only (they are opaque strings: SPEC, STYLE).

A cache fed by a watch also takes the API server's direct answers (a write's
result, a read) at once, so the next decision sees them. The watch then catches
up from behind: until it delivers the answer's own version, what it delivers is
older than the answer and must not replace it. Without ordering versions, the
order that is known is the watch's own: it delivers an object's versions in the
order they were written, every one of them while the stream lasts. So:

- an **answer** whose version the cache holds already changes nothing; one whose
  version the watch delivered before (``passed``) is stale (the watch went past it
  while the request was on its way back) and is dropped; any other answer is newer
  than everything the watch delivered, is taken, and is **awaited**;
- an **event** while an answer is awaited: the awaited version itself ends the
  wait (the cache already holds that body); another version is older and dropped;
- the wait is bounded (``until``): a version the watch never delivers (a re-list
  after an expired watch skips versions; a stale answer the ``passed`` memory no
  longer held) would otherwise freeze the object's view for good. After the bound
  the watch is believed again; the cost of a bound too short is an older view for
  as long as the watch lags, never a view that stops moving.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Awaited:
    """A direct answer's version the watch has not delivered yet."""

    resource_version: str
    until: float  # on the cache's monotonic clock, seconds: believe the watch again after it


@dataclass(frozen=True, slots=True)
class Judgement:
    take: bool  # replace the held view with the one offered
    awaited: Awaited | None  # what to wait for afterwards (None: nothing)


def judge_answer(
    held: str | None,
    passed: Sequence[str],
    answer: str,
    awaited: Awaited | None,
    now: float,
    *,
    watch_lag: float,
) -> Judgement:
    """A direct answer at version ``answer``, with the view at ``held`` (None: no view)
    and ``passed`` the versions the watch delivered lately, newest last."""
    if answer == held:
        return Judgement(take=False, awaited=awaited)
    if answer in passed:
        return Judgement(take=False, awaited=awaited)  # the watch is past it already
    return Judgement(take=True, awaited=Awaited(answer, now + watch_lag))


def judge_event(awaited: Awaited | None, event: str, held: str | None, now: float) -> Judgement:
    """A watch event at version ``event``."""
    if awaited is None:
        return Judgement(take=event != held, awaited=None)
    if event == awaited.resource_version:
        return Judgement(take=event != held, awaited=None)
    if now < awaited.until:
        return Judgement(take=False, awaited=awaited)  # older than the answer held
    return Judgement(take=True, awaited=None)  # the awaited version is not coming
