"""What one claim costs the API server and the operator, and the claims per second
one operator replica sustains on paper from those costs.

The API server's own count of the requests it served (``apiserver_request_total``
on its ``/metrics``) is read before and after a window; writes are its POST, PUT,
PATCH and DELETE, by resource and subresource, Leases left out (leader election
and the played nodes' renewals run whatever the claims do). The operator's CPU is
its process's user + system time over the same window.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def api_writes(api: Any) -> Counter[str]:
    """Writes the API server has served since it started, by ``resource[/subresource]``."""
    config = api.configuration
    headers = {"Authorization": token} if (token := config.api_key.get("BearerToken")) else {}
    response = api.call_api("GET", config.host + "/metrics", headers, _request_timeout=30)
    try:
        response.read()
        if response.status != 200:
            raise RuntimeError(f"GET /metrics: {response.status} {response.data[:200]!r}")
        return parse_writes(response.data.decode())
    finally:
        response.close()


def parse_writes(text: str) -> Counter[str]:
    """``apiserver_request_total`` writes in a ``/metrics`` text, Leases left out."""
    writes: Counter[str] = Counter()
    for line in text.splitlines():
        if not (match := _SAMPLE.match(line)):
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        if labels.get("verb") not in WRITE_VERBS or labels.get("resource") == "leases":
            continue
        name = labels.get("resource", "?")
        if labels.get("subresource"):
            name += "/" + labels["subresource"]
        writes[name] += int(float(match["value"]))
    return writes


@dataclass(frozen=True)
class ClaimCosts:
    claims: int
    writes: Counter[str]  # every party's writes over the window
    client_writes: int  # the bench's own: claims created, members set Running
    operator_cpu: float  # seconds

    @property
    def writes_per_claim(self) -> float:
        return sum(self.writes.values()) / self.claims

    @property
    def operator_writes_per_claim(self) -> float:
        return (sum(self.writes.values()) - self.client_writes) / self.claims

    @property
    def cpu_per_claim(self) -> float:
        return self.operator_cpu / self.claims

    def on_paper(self, writes_per_second: float) -> tuple[float, str]:
        """Claims/s one operator replica sustains where the API server takes
        ``writes_per_second`` writes, and the first limit. One replica runs on one
        core at most: the operator is one Python process, its threads share one
        interpreter lock."""
        by_api = writes_per_second / self.writes_per_claim
        by_cpu = 1.0 / self.cpu_per_claim if self.cpu_per_claim > 0 else float("inf")
        if by_api <= by_cpu:
            return by_api, (
                f"the API server's writes ({self.writes_per_claim:.2f} a claim, all parties)"
            )
        return by_cpu, f"the operator's CPU ({self.cpu_per_claim * 1000:.2f} ms a claim)"

    def breakdown(self) -> str:
        return ", ".join(
            f"{name} {count / self.claims:.2f}" for name, count in self.writes.most_common()
        )
