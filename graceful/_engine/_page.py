"""The engine's Prometheus page: metric selectors, and reading the watched metrics off a page.

Real vLLM pages run to hundreds of KB of histogram buckets, so only the lines about the
watched metrics are parsed. Names match exactly, never by prefix; every matching series is
summed; values go through prometheus-client's parser.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from .._drain._errors import ConfigError

__all__ = ["MetricSpec", "PageError", "has_only", "parse_metric", "prefilter", "read_metrics"]

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"[ \t]*(,|$)')
_SELECTOR_HELP = (
    """give NAME or NAME{label="value",...} with double-quoted values, """
    """e.g. --metric 'nv_trt_llm_request_metrics{request_type="active"}'"""
)


@dataclass(frozen=True)
class MetricSpec:
    """A metric name, optionally narrowed to the series whose labels equal ``labels``."""

    name: str
    labels: tuple[tuple[str, str], ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in self.labels)


def parse_metric(text: str) -> MetricSpec:
    """Parse ``name`` or ``name{label="value",...}``; raises :class:`ConfigError` naming the value."""
    if not isinstance(text, str):
        raise ConfigError(f"metric: {text!r} is not a string; {_SELECTOR_HELP}")
    stripped = text.strip()
    brace = stripped.find("{")
    name = stripped if brace == -1 else stripped[:brace].rstrip()
    if not _NAME.fullmatch(name):
        raise ConfigError(f"metric: {text!r} is not a Prometheus metric name; {_SELECTOR_HELP}")
    if brace == -1:
        return MetricSpec(name)
    if not stripped.endswith("}"):
        raise ConfigError(f"metric: {text!r} has an unclosed label selector; {_SELECTOR_HELP}")
    body = stripped[brace + 1 : -1]
    labels: dict[str, str] = {}
    pos = 0
    while body[pos:].strip():
        match = _LABEL.match(body, pos)
        if match is None:
            raise ConfigError(f"metric: {text!r} has a malformed label selector; {_SELECTOR_HELP}")
        key, raw = match.group(1), match.group(2)
        value = re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), raw)
        if key in labels:
            raise ConfigError(f"metric: {text!r} names label {key!r} twice; {_SELECTOR_HELP}")
        labels[key] = value
        pos = match.end()
    if not labels:
        raise ConfigError(f"metric: {text!r} has an empty label selector; drop the braces or {_SELECTOR_HELP}")
    return MetricSpec(name, tuple(sorted(labels.items())))


class PageError(ValueError):
    """The page is not Prometheus text exposition where it matters."""


def prefilter(page: str, names: Collection[str]) -> str:
    """Keep only the lines about ``names`` (and their HELP/TYPE lines), in page order.

    Real vLLM pages run to hundreds of KB of histogram buckets; the text parser costs
    microseconds per line, ``str.find`` costs nanoseconds per byte. A metric name occurs
    a handful of times on a page, so each occurrence may cost a look at its own line.
    """
    # A counter is one metric under two names: prometheus-client writes ``foo_total``,
    # other exporters (TGI, Triton) write ``foo``, and the parser reports ``foo_total``.
    related = set(names) | {name + "_total" for name in names}
    related |= {name[: -len("_total")] for name in names if name.endswith("_total")}
    text = "\n" + page
    spans: set[tuple[int, int]] = set()
    for name in related:
        pos = text.find(name)
        while pos != -1:
            after = pos + len(name)
            following = text[after] if after < len(text) else "\n"
            start = text.rfind("\n", 0, pos) + 1
            prefix = text[start:pos]
            # A sample line (leading spaces or tabs are valid), or this name's HELP or TYPE line.
            sample = following in "{ \t" and not prefix.strip(" \t")
            comment = following in " \t\r\n" and prefix[-1:] in (" ", "\t") and prefix.split() in _COMMENTS
            if sample or comment:
                end = text.find("\n", after)
                spans.add((start, len(text) if end == -1 else end))
            pos = text.find(name, after)
    return "".join(text[start:end].lstrip(" \t") + "\n" for start, end in sorted(spans))


_COMMENTS = (["#", "HELP"], ["#", "TYPE"])
_SUMMED = ("counter", "unknown", "untyped")


def read_metrics(page: str, names: Sequence[str]) -> dict[str, float | None]:
    """Sum the matching series of each metric in ``names`` on a Prometheus text page.

    Each name is ``name`` or ``name{label="value",...}``; a selector keeps only the series
    whose labels equal every given value. Names match exactly, never by prefix. When no
    series carries the exact name, a counter answers to its name with or without
    ``_total``. The value is ``None`` when the metric is absent and NaN when a series reads
    NaN. Raises :class:`PageError` when a line about one of ``names`` is malformed, and
    :class:`ConfigError` for a malformed name.
    """
    specs = {name: parse_metric(name) for name in names}
    exact: dict[str, float | None] = dict.fromkeys(names)
    alias: dict[str, float | None] = dict.fromkeys(names)
    try:
        families = list(text_string_to_metric_families(prefilter(page, {s.name for s in specs.values()})))
    except (ValueError, IndexError, KeyError) as exc:
        raise PageError(f"malformed metric line ({exc})") from None
    for family in families:
        # The parser files ``foo`` of a ``counter`` family as ``foo_total``, and ``foo_total`` under a
        # ``# TYPE foo counter`` line (OpenMetrics style) as an untyped family of its own.
        summed = family.type in _SUMMED
        for sample in family.samples:
            for key, spec in specs.items():
                if not spec.matches(sample.labels):
                    continue
                if sample.name == spec.name:
                    target = exact
                elif summed and (
                    sample.name == spec.name + "_total"
                    or (spec.name.endswith("_total") and sample.name == spec.name[: -len("_total")])
                ):
                    target = alias
                else:
                    continue
                previous = target[key]
                target[key] = float(sample.value) + (0.0 if previous is None else previous)
    # Exact name first: a gauge ``foo`` and an unrelated counter ``foo_total`` on one page are two metrics.
    return {name: alias[name] if exact[name] is None else exact[name] for name in names}


def has_only(page: str, allowed: Collection[str]) -> bool:
    """Whether every sample line on ``page`` is about one of ``allowed`` (an empty page qualifies)."""
    for line in page.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _NAME.match(line)
        name = match.group(0) if match else line
        if name not in allowed:
            return False
    return True
