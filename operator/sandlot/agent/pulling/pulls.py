"""Image pulls on their own threads, one per (image, credential identity) however many
sandboxes want it.

A start that needs an image asks ``ImagePulls``: the decision is
``policy.pulling.decision.decide_pull`` over the history of this image for this
sandbox's credential identity (``policy.pulling.credentials``), so one tenant's failures
never back off another's, and nobody joins a pull made with another's
credential. An image the node has is run for an identity only once it is
verified (``agent.pulling.access``); a verification, one manifest HEAD, runs on
the same pool as pulls, with the same history and back-off. A pull runs on the
pull pool (never on the sandbox work pool, so a slow registry holds no start,
stop or teardown, and never the heartbeat) and the start returns at once with
its sandbox ``Scheduled``/``Pulling``. Progress and the end of a pull wake the
sync, whose next pass starts the sandbox from the pulled image; a failed pull
wakes it again when its back-off ends.

Images with a pull or a start in flight are reported by ``starting()``: the
image collector treats them as in use, so it never evicts an image between its
pull and the container that will hold it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Protocol

from sandlot.adapters.pulling import Credential, Endpoint, RegistryError
from sandlot.adapters.runtime import RuntimeError_
from sandlot.agent.pulling.access import ImageAccess
from sandlot.api.keys import LAST_USED_LABEL, PULLED_BY_AGENT_LABEL
from sandlot.api.timestamps import rfc3339
from sandlot.policy.pulling import (
    BACKOFF_BASE,
    BACKOFF_CAP,
    FailureKind,
    ImageReference,
    InvalidReference,
    PullDecision,
    PullHistory,
    PullPolicy,
    VerifyPolicy,
    decide_pull,
    parse_reference,
)

log = logging.getLogger(__name__)

PROGRESS_WAKE_SECONDS = 2.0

PullKey = tuple[str, str]
"""(image, credential identity): what pulls, verifications and their history are kept by."""


class Puller(Protocol):
    """What ``ImagePulls`` needs of a runtime that pulls (``ContainerdPuller``)."""

    def image_labels(self, name: str, *, timeout: float) -> Mapping[str, str] | None: ...

    def verify(
        self,
        ref: ImageReference,
        endpoints: list[Endpoint],
        credential: Credential | None,
        *,
        deadline: float,
    ) -> None: ...

    def pull(
        self,
        name: str,
        ref: ImageReference,
        endpoints: list[Endpoint],
        credential: Credential | None,
        *,
        deadline: float,
        labels: Mapping[str, str],
        progress: Callable[[int, int], None] | None = None,
    ) -> object: ...


class PullMetrics(Protocol):
    def observe_pull(self, outcome: str, seconds: float, fetched_bytes: int) -> None: ...

    def observe_verification(self, outcome: str) -> None: ...


@dataclass(frozen=True)
class PullOptions:
    deadline: float
    """Seconds one pull may take in all."""
    call_timeout: float
    """Seconds for the presence check (one containerd call)."""
    workers: int = 2
    backoff: timedelta = BACKOFF_BASE
    """The first wait after a failed pull; it doubles up to ``max_backoff``."""
    max_backoff: timedelta = BACKOFF_CAP


class ImagePulls:
    def __init__(
        self,
        puller: Callable[[], Puller],
        endpoints: Callable[[ImageReference], list[Endpoint]],
        options: PullOptions,
        wake: threading.Event,
        metrics: PullMetrics,
        clock: Callable[[], datetime],
        access: ImageAccess | None = None,
    ) -> None:
        """``access``: which identities may use which images (None: in memory, the
        default policy)."""
        self._puller = puller
        self.access = access or ImageAccess(None, VerifyPolicy.NEVER_VERIFY_PRELOADED)
        self._endpoints = endpoints
        self.options = options
        self._wake = wake
        self._metrics = metrics
        self._clock = clock
        self._lock = threading.Lock()
        self._history: dict[PullKey, PullHistory] = {}
        self._progress: dict[PullKey, tuple[int, int]] = {}
        self._holds: Counter[str] = Counter()
        self._timers: list[threading.Timer] = []
        self._pool = ThreadPoolExecutor(max_workers=options.workers, thread_name_prefix="pull")

    # ------------------------------------------------------------ what starts ask

    def history(self, key: PullKey) -> PullHistory:
        with self._lock:
            return self._history.get(key, PullHistory())

    def progress(self, key: PullKey) -> tuple[int, int]:
        with self._lock:
            return self._progress.get(key, (0, 0))

    def decide(self, key: PullKey, policy: PullPolicy, joined: int | None) -> PullDecision:
        """The decision for a start of ``key``'s image by a sandbox of ``key``'s identity;
        asks containerd about the image only when the policy needs to know."""
        image, identity = key
        history = self.history(key)
        present, verified = False, True
        if not history.in_flight:
            labels = self._puller().image_labels(image, timeout=self.options.call_timeout)
            present = labels is not None
            verified = not present or not self.access.needs_verification(image, identity, labels)
        return decide_pull(
            policy,
            present=present,
            history=history,
            joined=joined,
            now=self._clock(),
            verified=verified,
            base=self.options.backoff,
            cap=self.options.max_backoff,
        )

    def labels(self, image: str) -> Mapping[str, str] | None:
        """The labels of ``image``'s record on the node; None when it is not there."""
        return self._puller().image_labels(image, timeout=self.options.call_timeout)

    def starting(self) -> frozenset[str]:
        """Images with a pull or a start in flight: in use, for the image collector."""
        with self._lock:
            return frozenset(image for image, n in self._holds.items() if n > 0)

    @contextlib.contextmanager
    def hold(self, image: str) -> Iterator[None]:
        with self._lock:
            self._holds[image] += 1
        try:
            yield
        finally:
            with self._lock:
                self._holds[image] -= 1
                if self._holds[image] <= 0:
                    del self._holds[image]

    def wake_at(self, when: datetime) -> None:
        """Wake the sync at ``when`` (the end of a back-off)."""
        delay = max((when - self._clock()).total_seconds(), 0.0)
        timer = threading.Timer(delay, self._wake.set)
        timer.daemon = True
        with self._lock:
            self._timers = [t for t in self._timers if t.is_alive()] + [timer]
        timer.start()

    # ------------------------------------------------------------ the pull

    def start(self, key: PullKey, credential: Credential | None, *, verify: bool = False) -> int:
        """Start pulling (``verify``: verifying ``credential`` for) ``key``'s image unless
        one is in flight for ``key``; the number of the one the caller waits for (the
        one started, or the one in flight)."""
        image = key[0]
        with self._lock:
            history = self._history.get(key, PullHistory())
            if history.in_flight:
                return history.started
            number = history.started + 1
            self._history[key] = replace(history, in_flight=True, started=number)
            self._progress[key] = (0, 0)
            self._holds[image] += 1
        try:
            self._pool.submit(self._run, key, credential, verify)
        except RuntimeError:  # shut down
            self._finish(key, (FailureKind.TRANSIENT, "the agent is stopping"))
        return number

    def _run(self, key: PullKey, credential: Credential | None, verify: bool) -> None:
        image = key[0]
        started = time.monotonic()
        last_wake = [0.0]

        def progress(done: int, total: int) -> None:
            with self._lock:
                self._progress[key] = (done, total)
            now = time.monotonic()
            if now - last_wake[0] >= PROGRESS_WAKE_SECONDS:
                last_wake[0] = now
                self._wake.set()

        failure: tuple[FailureKind, str] | None = None
        fetched = 0
        try:
            ref = parse_reference(image)
            if verify:
                self._puller().verify(
                    ref, self._endpoints(ref), credential, deadline=self.options.deadline
                )
            else:
                result = self._puller().pull(
                    image,
                    ref,
                    self._endpoints(ref),
                    credential,
                    deadline=self.options.deadline,
                    labels={
                        LAST_USED_LABEL: rfc3339(self._clock(), "seconds"),
                        PULLED_BY_AGENT_LABEL: "true",
                    },
                    progress=progress,
                )
                fetched = int(getattr(result, "fetched_bytes", 0))
        except InvalidReference as exc:
            failure = (FailureKind.NOT_FOUND, str(exc))
        except RegistryError as exc:
            failure = (exc.kind, str(exc))
        except (RuntimeError_, OSError, ValueError) as exc:
            failure = (FailureKind.TRANSIENT, str(exc))
        except Exception as exc:  # a bug must not leave the image "in flight" forever
            log.exception("pull of %s failed unexpectedly", image)
            failure = (FailureKind.TRANSIENT, f"{type(exc).__name__}: {exc}")
        seconds = time.monotonic() - started
        what = "verification" if verify else "pull"
        outcome = "success" if failure is None else failure[0].value
        if verify:
            self._metrics.observe_verification(outcome)
        else:
            self._metrics.observe_pull(outcome, seconds, fetched)
        if failure is None and verify:
            log.info("verified %s for credential identity %s", image, key[1][:19])
        elif failure is None:
            log.info("pulled %s in %.1fs (%d bytes fetched)", image, seconds, fetched)
        else:
            log.warning("%s of %s failed (%s): %s", what, image, failure[0], failure[1])
        self._finish(key, failure)

    def _finish(self, key: PullKey, failure: tuple[FailureKind, str] | None) -> None:
        image = key[0]
        now = self._clock()
        if failure is None:
            self.access.record(*key)
        with self._lock:
            history = self._history.get(key, PullHistory())
            if failure is None:
                self._history[key] = history.succeeded(now)
            else:
                self._history[key] = history.failed(failure[0], failure[1], now)
            self._progress.pop(key, None)
            self._holds[image] -= 1
            if self._holds[image] <= 0:
                del self._holds[image]
        self._wake.set()

    def close(self) -> None:
        with self._lock:
            timers = list(self._timers)
        for timer in timers:
            timer.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["ImagePulls", "PullKey", "PullMetrics", "PullOptions", "Puller"]
