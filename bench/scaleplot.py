"""An SVG of the scale runs' figures against fleet size, with no plotting library.

Reads the JSON lines ``bench/scale.py --figures`` appends (one line a run) and
draws three panels on a log x axis (sandboxes; nodes = sandboxes / 30): memory
(peak and steady RSS), CPU (idle cores) and reaction (one node lost, 10 % lost).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

PANELS: list[tuple[str, str, list[tuple[str, str, float]]]] = [
    ("memory", "MiB", [("peak_kb", "start-up peak RSS", 1 / 1024),
                       ("rss_full_kb", "steady RSS", 1 / 1024)]),
    ("CPU", "cores", [("idle_cpu", "idle CPU", 1.0)]),
    ("reaction", "s after deadline", [("react_one_s", "one node lost", 1.0),
                                      ("react_10pct_off_last_mark_s", "10% lost, last mark",
                                       1.0)]),
]  # fmt: skip
COLOURS = ("#1f77b4", "#d62728", "#2ca02c")
W, H, PAD = 300, 220, 45


def _panel(x0: int, title: str, unit: str, runs: list[dict[str, float]],
           series: list[tuple[str, str, float]]) -> list[str]:  # fmt: skip
    xs = [math.log10(r["sandboxes"]) for r in runs]
    ys = [r[k] * f for r in runs for k, _, f in series if k in r]
    xlo, xhi = min(xs) - 0.2, max(xs) + 0.2
    yhi = max([*ys, 1e-9]) * 1.15

    def px(x: float, y: float) -> tuple[float, float]:
        return (x0 + PAD + (x - xlo) / (xhi - xlo) * (W - PAD - 10),
                H - PAD - y / yhi * (H - PAD - 25))  # fmt: skip

    out = [f'<text x="{x0 + W / 2}" y="15" text-anchor="middle">{title}</text>',
           f'<line x1="{x0 + PAD}" y1="{H - PAD}" x2="{x0 + W - 10}" y2="{H - PAD}" stroke="#000"/>',
           f'<line x1="{x0 + PAD}" y1="25" x2="{x0 + PAD}" y2="{H - PAD}" stroke="#000"/>',
           f'<text x="{x0 + 5}" y="30" font-size="9">{yhi:.3g}</text>',
           f'<text x="{x0 + 5}" y="{H - PAD + 3}" font-size="9">0 {unit}</text>']  # fmt: skip
    for r in runs:
        x, _ = px(math.log10(r["sandboxes"]), 0)
        out.append(f'<text x="{x}" y="{H - PAD + 14}" font-size="9" text-anchor="middle">'
                   f'{int(r["sandboxes"]):,}/{int(r["nodes"]):,}</text>')  # fmt: skip
    for i, (key, label, factor) in enumerate(series):
        # A run stopped before this figure has no point here, not a zero.
        pts = [px(math.log10(r["sandboxes"]), r[key] * factor) for r in runs if key in r]
        colour = COLOURS[i % len(COLOURS)]
        out.append(f'<polyline fill="none" stroke="{colour}" points="'
                   + " ".join(f"{a:.1f},{b:.1f}" for a, b in pts) + '"/>')  # fmt: skip
        out += [f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{colour}"/>' for a, b in pts]
        out.append(f'<text x="{x0 + PAD + 5}" y="{H - 8 - 11 * i}" font-size="9" '
                   f'fill="{colour}">{label}</text>')  # fmt: skip
    return out


def write_plot(figures: Path, target: Path) -> None:
    runs = [json.loads(line) for line in figures.read_text().splitlines() if line.strip()]
    best: dict[tuple[float, float], dict[str, float]] = {}
    for r in runs:  # the latest run of each size
        best[(r["sandboxes"], r["nodes"])] = r
    ordered = sorted(best.values(), key=lambda r: r["sandboxes"])
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W * len(PANELS)}" '
             f'height="{H}" font-family="sans-serif" font-size="11">',
             f'<rect width="{W * len(PANELS)}" height="{H}" fill="#fff"/>']  # fmt: skip
    for i, (title, unit, series) in enumerate(PANELS):
        parts += _panel(i * W, title, unit, ordered, series)
    parts.append("</svg>")
    target.write_text("\n".join(parts) + "\n")


if __name__ == "__main__":
    write_plot(Path(sys.argv[1]), Path(sys.argv[2]))
