"""Benchmark 6: one engine-mode poll of a ~500 KB vLLM-style ``/metrics`` page.

The page is generated: 14 data-parallel engines, each with vLLM's gauges, counters and
histograms (many buckets), plus the process and GC metrics prometheus-client adds, and
the ``vllm:num_requests_waiting_by_reason`` look-alike. Compared side by side:

- graceful's ``read_metrics`` (filter the page's lines first, then parse what is left);
- the plain prometheus-client text parser over the whole page, summing the same gauges.

Both are timed on the page in memory, and as a whole poll (HTTP GET over keep-alive from a
separate uvicorn process serving the page's bytes on 127.0.0.1, then the parse). Variants alternate.

    python -m benchmarks.engine [--engines 14] [--rounds 20]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import anyio
import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks._common import machine, median, table, verdict
from benchmarks._uvicorn import uvicorn_server
from graceful._engine._page import read_metrics
from graceful._engine._presets import PRESETS

__all__ = ["NAMES", "main", "plain_parse", "read_metrics", "vllm_page"]

NAMES = PRESETS["vllm"].metrics
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
LATENCY: tuple[float, ...] = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
)
LATENCY += (80.0, 160.0, 640.0, 2560.0)
TOKENS: tuple[float, ...] = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": LATENCY,
    "vllm:inter_token_latency_seconds": LATENCY,
    "vllm:time_per_output_token_seconds": LATENCY,
    "vllm:e2e_request_latency_seconds": LATENCY,
    "vllm:request_queue_time_seconds": LATENCY,
    "vllm:request_inference_time_seconds": LATENCY,
    "vllm:request_prefill_time_seconds": LATENCY,
    "vllm:request_decode_time_seconds": LATENCY,
    "vllm:request_prompt_tokens": TOKENS,
    "vllm:request_generation_tokens": TOKENS,
    "vllm:request_max_num_generation_tokens": TOKENS,
    "vllm:iteration_tokens_total": TOKENS,
    "vllm:request_params_n": (1, 2, 5, 10, 20),
    "vllm:request_params_max_tokens": TOKENS,
}


def vllm_page(engines: int) -> str:
    """A vLLM v1-style page; running = 3 per engine and waiting = 1 per engine, so the sums are known."""
    out: list[str] = []
    for name, doc in (("python_gc_objects_collected_total", "Objects collected during gc"),):
        out += [f"# HELP {name} {doc}", f"# TYPE {name} counter"]
        out += [f'{name}{{generation="{g}"}} {1000.0 * (g + 1)}' for g in range(3)]
    for name in ("process_virtual_memory_bytes", "process_resident_memory_bytes", "process_open_fds"):
        out += [f"# HELP {name} Process metric.", f"# TYPE {name} gauge", f"{name} 1.2345e+09"]

    def labels(engine: int, more: str = "") -> str:
        return f'{{engine="{engine}",model_name="{MODEL}"{more}}}'

    def extra(key: str, value: object) -> str:
        return f',{key}="{value}"'

    gauges = {
        "vllm:num_requests_running": 3.0,
        "vllm:num_requests_waiting": 1.0,
        "vllm:kv_cache_usage_perc": 0.42,
        "vllm:num_requests_swapped": 0.0,
    }
    for name, value in gauges.items():
        out += [f"# HELP {name} Number of requests / usage.", f"# TYPE {name} gauge"]
        out += [f"{name}{labels(e)} {value}" for e in range(engines)]
    name = "vllm:num_requests_waiting_by_reason"
    out += [f"# HELP {name} Waiting requests by reason.", f"# TYPE {name} gauge"]
    out += [f"{name}{labels(e, extra('reason', r))} 7.0" for e in range(engines) for r in ("capacity", "deferred")]
    for name in ("vllm:prompt_tokens", "vllm:generation_tokens", "vllm:num_preemptions"):
        out += [f"# HELP {name}_total Tokens.", f"# TYPE {name}_total counter"]
        out += [f"{name}_total{labels(e)} 123456.0" for e in range(engines)]
    name = "vllm:request_success"
    out += [f"# HELP {name}_total Finished requests.", f"# TYPE {name}_total counter"]
    out += [
        f"{name}_total{labels(e, extra('finished_reason', r))} 999.0"
        for e in range(engines)
        for r in ("stop", "length", "abort")
    ]
    for name, buckets in HISTOGRAMS.items():
        out += [f"# HELP {name} Histogram of {name}.", f"# TYPE {name} histogram"]
        for e in range(engines):
            count = 0
            for bound in buckets:
                count += 7
                out.append(f"{name}_bucket{labels(e, extra('le', float(bound)))} {float(count)}")
            out.append(f"{name}_bucket{labels(e, extra('le', '+Inf'))} {float(count)}")
            out.append(f"{name}_count{labels(e)} {float(count)}")
            out.append(f"{name}_sum{labels(e)} {count * 0.123}")
        for e in range(engines):
            out.append(f"{name}_created{labels(e)} 1.7e+09")
    return "\n".join(out) + "\n"


def plain_parse(page: str, names: tuple[str, ...]) -> dict[str, float | None]:
    sums: dict[str, float | None] = dict.fromkeys(names)
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name in sums:
                sums[sample.name] = (sums[sample.name] or 0.0) + sample.value
    return sums


@contextmanager
def page_server(page: str) -> Iterator[str]:
    """uvicorn serving ``page`` (``benchmarks.apps:metrics_page``); yields its URL."""
    with tempfile.TemporaryDirectory(prefix="gb-") as directory:
        path = os.path.join(directory, "metrics")
        with open(path, "w") as f:
            f.write(page)
        env = {**os.environ, "GRACEFUL_BENCH_PAGE": path}
        with uvicorn_server("benchmarks.apps:metrics_page", env=env) as server:
            yield f"http://127.0.0.1:{server.port}/metrics"


async def measure(page: str, rounds: int) -> dict[str, list[float]]:
    parsers: dict[str, Callable[[str, tuple[str, ...]], dict[str, float | None]]] = {
        "graceful read_metrics": lambda p, n: read_metrics(p, n),
        "prometheus-client text parser": plain_parse,
    }
    expected = read_metrics(page, NAMES)
    if plain_parse(page, NAMES) != expected:
        raise AssertionError(f"the two parsers disagree: {plain_parse(page, NAMES)} != {expected}")
    samples: dict[str, list[float]] = {}
    with page_server(page) as url:
        async with httpx.AsyncClient() as client:
            await client.get(url)
            for i in range(rounds):
                order = list(parsers.items())
                for name, parse in order if i % 2 == 0 else order[::-1]:
                    start = time.perf_counter()
                    parse(page, NAMES)
                    samples.setdefault(f"{name}: parse only", []).append(time.perf_counter() - start)
                    start = time.perf_counter()
                    response = await client.get(url)
                    fetched = time.perf_counter()
                    parse(response.text, NAMES)
                    done = time.perf_counter()
                    samples.setdefault(f"{name}: whole poll (GET + parse)", []).append(done - start)
                    samples.setdefault("HTTP GET alone (within the polls)", []).append(fetched - start)
    return samples


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--engines", type=int, default=14, help="data-parallel engines on the page (size scales)")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args(argv)
    page = vllm_page(args.engines)
    samples = anyio.run(measure, page, args.rounds)
    ms = 1e3
    med = {name: median(values) for name, values in samples.items()}
    rows = [[name, f"{value * ms:.2f}", f"{min(samples[name]) * ms:.2f}"] for name, value in med.items()]
    ours = med["graceful read_metrics: whole poll (GET + parse)"]
    plain = med["prometheus-client text parser: whole poll (GET + parse)"]
    ours_parse = med["graceful read_metrics: parse only"]
    plain_parse_ = med["prometheus-client text parser: parse only"]
    lines = page.count("\n")
    print(f"Machine: {machine()}\n")
    print(f"Page: {len(page.encode()) / 1024:.0f} KiB, {lines} lines, {args.engines} engines; {args.rounds} rounds.\n")
    print(table(["step", "median (ms)", "min (ms)"], rows))
    print()
    targets = [
        ["whole poll, graceful", f"{ours * ms:.2f} ms", "<= 5 ms", verdict(ours <= 0.005)],
        ["parse only, graceful", f"{ours_parse * ms:.2f} ms", "<= 5 ms", verdict(ours_parse <= 0.005)],
        ["plain parser / graceful, parse only", f"{plain_parse_ / ours_parse:.0f}x", "(context)", "-"],
        ["plain parser / graceful, whole poll", f"{plain / ours:.1f}x", "(context)", "-"],
    ]
    print(table(["engine poll", "measured", "target", ""], targets))


if __name__ == "__main__":
    main()
