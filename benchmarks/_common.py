"""Shared helpers: robust statistics, the machine line and Markdown tables."""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Sequence

__all__ = ["machine", "median", "percentile", "table", "verdict"]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); exact on small samples, no interpolation."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def machine() -> str:
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{os.cpu_count()} CPU(s), {model}, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}, load average {load:.2f}"
    )


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"
