"""Drain an inference engine you cannot wrap (vLLM, SGLang, TGI, Triton) from outside.

``wait_idle`` polls the engine's Prometheus ``/metrics`` page until its running and
waiting requests read zero on consecutive reads, within the drain's budget rule,
``min(timeout, grace_period - reserve)`` (kthena's 70% rule with ``grace_share=0.7``).
It is what ``graceful drain --engine`` runs in a preStop hook.
"""

from ._engine._config import MAX_KV_BUFFER, EngineConfig, EngineDrainResult, EngineProgress, effective_wait
from ._engine._page import read_metrics
from ._engine._presets import PRESETS, EnginePreset
from ._engine._wait import wait_idle

__all__ = [
    "MAX_KV_BUFFER",
    "PRESETS",
    "EngineConfig",
    "EngineDrainResult",
    "EnginePreset",
    "EngineProgress",
    "effective_wait",
    "read_metrics",
    "wait_idle",
]
