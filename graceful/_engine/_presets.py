"""The engines graceful knows: which metrics count their in-flight work, and where they serve them.

Data, with the reasons for each choice beside it (docs/engines.md, "Presets").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["PRESETS", "EnginePreset"]


@dataclass(frozen=True)
class EnginePreset:
    """The metrics that count an engine's in-flight requests, and where it serves them.

    ``optional`` metrics read 0 when absent: they belong to one backend or one serving
    mode only (Triton's backends, SGLang's prefill/decode queues), so their absence means
    "not this backend", never "unknown". Every other metric is required, and an absent
    required metric is unknown. ``activity`` counters must hold still across the zero
    reads: a change means requests moved while the gauges read zero (SGLang refreshes its
    gauges only at batch log points). ``min_idle_span`` is the shortest time the zero
    reads must cover. ``fresh_page`` lists the only metrics the page of an engine that
    has never served a request may hold (TGI registers its gauges at the first request):
    when no preset metric is on the page and nothing else is either, every metric reads 0.
    ``absent_hint`` is said when a required metric is absent. ``histogram`` is the engine's
    request-duration histogram, which ``graceful advise`` reads ("" when it publishes none).
    ``health`` is the path of the engine's health check on the same host and port as its page
    ("" when there is none there): a dead engine's gauges freeze, so while they read busy the
    health check says whether the engine is alive to finish that work.
    """

    name: str
    running: tuple[str, ...]
    waiting: tuple[str, ...]
    url: str
    optional: tuple[str, ...] = ()
    activity: tuple[str, ...] = ()
    min_idle_span: float = 0.0
    fresh_page: tuple[str, ...] | None = None
    absent_hint: str = ""
    histogram: str = ""
    health: str = ""

    @property
    def metrics(self) -> tuple[str, ...]:
        return self.running + self.waiting

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(name for name in self.metrics if name not in self.optional)


_SGLANG_PD = (
    "sglang:num_prefill_prealloc_queue_reqs",  # prefill worker: waiting for the decode peer's bootstrap
    "sglang:num_prefill_inflight_queue_reqs",  # prefill worker: KV cache being sent
    "sglang:num_decode_prealloc_queue_reqs",  # decode worker: waiting for KV memory
    "sglang:num_decode_transfer_queue_reqs",  # decode worker: KV cache being received
)
_TRITON_BACKENDS = (
    'nv_trt_llm_request_metrics{request_type="active"}',  # TensorRT-LLM backend: in the executor
    "vllm:num_requests_running",  # vLLM backend
    'nv_trt_llm_request_metrics{request_type="waiting"}',  # TensorRT-LLM: queued in the executor (newer)
    "vllm:num_requests_waiting",
)

PRESETS: Mapping[str, EnginePreset] = {
    preset.name: preset
    for preset in (
        EnginePreset(
            "vllm",
            ("vllm:num_requests_running",),
            ("vllm:num_requests_waiting",),
            "http://127.0.0.1:8000/metrics",
            absent_hint="is the engine started with --disable-log-stats?",
            # Arrival to finish (vllm/v1/metrics/loggers.py), in REQUEST_LATENCY_BUCKETS.
            histogram="vllm:e2e_request_latency_seconds",
            # 503 once the engine core has died (EngineDeadError,
            # vllm/entrypoints/serve/instrumentator/health.py); /metrics keeps its last values.
            health="/health",
        ),
        EnginePreset(
            "sglang",
            ("sglang:num_running_reqs", _SGLANG_PD[1], _SGLANG_PD[3]),
            ("sglang:num_queue_reqs", "sglang:num_grammar_queue_reqs", _SGLANG_PD[0], _SGLANG_PD[2]),
            "http://127.0.0.1:30000/metrics",
            optional=("sglang:num_grammar_queue_reqs", *_SGLANG_PD),
            # Finished requests, first tokens and streamed tokens: any of them moving means work.
            activity=(
                "sglang:num_requests_total",
                "sglang:time_to_first_token_seconds_count",
                "sglang:inter_token_latency_seconds_count",
            ),
            # A request that reaches an idle scheduler is logged as 0 running, 0 queued by its own
            # prefill batch; the next refresh comes after --decode-log-interval (40) decode steps.
            min_idle_span=5.0,
            absent_hint="is the engine started with --enable-metrics?",
            histogram="sglang:e2e_request_latency_seconds",  # sglang/srt/metrics/collector.py
            # 503 when the scheduler has not answered a health generation in time
            # (sglang/srt/entrypoints/http_server.py, health_generate).
            health="/health",
        ),
        # TGI serves /metrics on its main port: 80 in the official container (PORT=80), 3000 outside it.
        EnginePreset(
            "tgi",
            ("tgi_batch_current_size",),
            ("tgi_queue_size",),
            "http://127.0.0.1:80/metrics",
            # The router installs its recorder after the backend sets this gauge, so even it is
            # usually missing; tgi_request_count appears with the first request.
            fresh_page=("tgi_batch_max_total_tokens",),
            histogram="tgi_request_duration",  # router/src/server.rs, seconds
            # 503 {"error":"unhealthy"} when a shard fails its health check (router/src/server.rs, health).
            health="/health",
        ),
        # Triton's pending count covers queued requests only; executing ones show in the backend's gauges.
        EnginePreset(
            "triton",
            _TRITON_BACKENDS[:2],
            ("nv_inference_pending_request_count", *_TRITON_BACKENDS[2:]),
            "http://127.0.0.1:8002/metrics",
            optional=_TRITON_BACKENDS,
        ),
    )
}
