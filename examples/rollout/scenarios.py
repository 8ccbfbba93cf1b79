"""Scenarios and the run of one side: replicas, balancer, rolling updates and soak traffic together."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import anyio
import httpx

from graceful import Budget, ConfigError
from graceful.soak import RequestRecord, SoakConfig, SoakReport, run_soak

from .balancer import L7_BALANCERS, Envoy, Nginx, open_balancer
from .litellm import MODEL, check_gateway, open_gateway
from .node import missing_node, node_streams
from .replica import Kind, ReplicaSettings
from .responses import responses_streams
from .short_grace import RETRYING, STRICT
from .timeline import Plan, Rollout, Termination
from .vllm import MODEL_NAME, VllmSetup, find_vllm, prepare

__all__ = ["SCENARIOS", "VLLM_SCENARIOS", "Options", "SideResult", "records_file", "run_side"]

SCENARIOS = (
    "default",
    "strict-clients",
    "long-streams",
    "long-streams-handoff",
    "ignore-term",
    "prestop-timeout",
    "lb-delay-30s",
    "observed-propagation",
    "client-disconnect",
    "node-loss",
    "short-grace",
)
# What --vllm runs: the scenarios that need nothing of the example server but its API.
VLLM_SCENARIOS = ("default", "strict-clients")
Retry = Literal["none", "sdk"]


@dataclass(frozen=True)
class Options:
    """Everything one demo run needs, with the scenario's adjustments already applied (see ``resolve``)."""

    scenario: str = "default"
    replicas: int = 3
    updates: int = 3
    duration: float | None = None
    retry: Retry = "sdk"
    admit_during_propagation: bool = True
    grace_period: float = 45.0
    reserve: float | None = None
    propagation_wait: float = 3.0
    propagation_quiet: float | None = None
    lb_delay: float = 1.0
    concurrency: int = 56
    tokens_per_second: float = 10.0
    short_tokens: int = 2
    long_tokens: int = 10
    stream_tokens: tuple[int, ...] = (10, 50, 200)
    step_pause: float = 12.0
    warmup: float = 4.0
    load_delay: float = 1.0
    balancer: str = "auto"
    gateway_retry: bool = False
    envoy_retry: str | None = None  # --balancer envoy: its retry profile (envoy.RETRIES; default none)
    active_hc: bool = False  # --balancer envoy: active health checking of /ready every 30 s
    announce_drain: bool = True  # the graceful side's responses announce its drain (GRACEFUL_ANNOUNCE_DRAIN)
    handoff_streams: bool = False  # the graceful side hands resumable streams off after the propagation wait
    admission: str | None = None  # the graceful side's admission option (GRACEFUL_ADMISSION); None: graceful's default
    stream_weights: tuple[float, ...] | None = None  # the stream workers' shares by length (None: 1, 1/2, 1/3...)
    resume: bool = False  # clients send through graceful's resuming transport (graceful soak --resume)
    gateway: str | None = None  # --gateway litellm: clients send through a LiteLLM proxy (examples/rollout/litellm.py)
    node_streams: int = (
        4  # behind the gateway: Node openai SDK callers of the longest streams (examples/rollout/node.py)
    )
    # Behind the gateway: Responses callers of the longest streams, the Node SDK's create and stream and curl
    # in turn (examples/rollout/responses.py).
    responses_streams: int = 3
    quick: bool = False
    seed: int | None = None
    vllm: bool = False  # replicas are vllm serve processes (examples/rollout/vllm.py)
    vllm_setup: VllmSetup | None = None  # their command and model, made once per run (``with_vllm_model``)

    @classmethod
    def resolve(
        cls,
        *,
        scenario: str = "default",
        quick: bool = False,
        vllm: bool = False,
        gateway: str | None = None,
        **given: Any,
    ) -> Options:
        """Defaults, then the quick (CI) sizes, then vLLM's, then the gateway's, then the scenario, with what the
        user set winning."""
        if scenario not in SCENARIOS:
            raise ConfigError(f"--scenario: {scenario!r} is not a scenario; use one of {', '.join(SCENARIOS)}")
        if vllm and scenario not in VLLM_SCENARIOS:
            raise ConfigError(
                f"--vllm: --scenario {scenario} runs with the example server only; "
                f"use --scenario {' or '.join(VLLM_SCENARIOS)} with --vllm, or drop --vllm"
            )
        if gateway is not None:
            check_gateway(gateway, scenario=scenario, vllm=vllm)
        user = {key: value for key, value in given.items() if value is not None}
        options = cls(scenario=scenario, quick=quick, vllm=vllm, gateway=gateway)
        if quick:
            options = replace(
                options,
                replicas=2,
                updates=1,
                grace_period=10.0,
                reserve=2.0,
                propagation_wait=1.0,
                lb_delay=0.5,
                concurrency=16,
                tokens_per_second=20.0,
                stream_tokens=(20, 60),
                step_pause=0.5,
                warmup=1.0,
                load_delay=0.3,
            )
        if vllm:
            find_vllm()  # a missing vLLM is a usage error, before anything starts
            # Sized for two cores: every vLLM engine busy-waits on core 0 (vllm.VLLM_ENV) and a
            # replica takes 25 to 90 s to start. One stream runs at about 400 tokens/s alone and
            # slower beside others and beside a starting replica: 100 tokens/s sizes the timeouts.
            options = replace(
                options,
                replicas=1 if quick else 2,
                updates=1,
                concurrency=6 if quick else 12,
                tokens_per_second=100.0,
                short_tokens=8,
                long_tokens=256,
                stream_tokens=(256, 1024) if quick else (256, 1024, 4096),
            )
            if quick:
                # The drain waits for 1024-token streams (about 10 s at worst); vLLM's exit takes 2 to 3 s.
                options = replace(options, grace_period=30.0, reserve=5.0)
            else:
                # Room for a 4096-token stream (about 41 s) in either admission mode.
                options = replace(options, grace_period=120.0)
        if gateway is not None:
            # Streams of 30 s (--quick: 15 s, longer than its grace period) are in flight at every drain: with
            # --handoff-streams the old replicas hand them off and exit, and the gateway continues them.
            longest = 30.0 if not quick else 15.0
            fast, medium = options.stream_tokens[:2]
            options = replace(
                options,
                stream_tokens=(fast, medium, int(longest * options.tokens_per_second)),
                node_streams=2 if quick else 4,
            )
        options = replace(options, **user)
        if scenario == "strict-clients" and "retry" not in user:
            options = replace(options, retry="none")
        elif scenario == "lb-delay-30s":
            delay = user.get("lb_delay", 30.0)
            # The fix the scenario teaches: a propagation wait longer than the balancer's delay,
            # and a grace period with room for it, the longest request and the reserve.
            wait = user.get("propagation_wait", delay + 1.0)
            options = replace(options, lb_delay=delay, propagation_wait=wait)
            if "grace_period" not in user:
                # Admitting, a connection busy at drain start may bring one more request (2 x longest).
                streams = 2 if options.admit_during_propagation else 1
                room = wait + streams * options.longest_stream + 2.0
                grace = room + (options.reserve if options.reserve is not None else max(10.0, 0.5 * room))
                options = replace(options, grace_period=grace)
        elif scenario == "observed-propagation":
            # A generous upper bound that the quiet rule must cut short: the balancer
            # forgets the endpoint after lb_delay, and the wait ends one quiet period later.
            options = replace(
                options,
                propagation_wait=user.get("propagation_wait", 30.0),
                propagation_quiet=user.get("propagation_quiet", 2.0),
                lb_delay=user.get("lb_delay", 3.0),
            )
            if "grace_period" not in user:
                room = options.propagation_wait + 2 * options.longest_stream + 2.0
                options = replace(options, grace_period=room + (options.reserve or max(10.0, 0.3 * room)))
        if scenario == "short-grace":
            options = _short_grace(options, user, quick=quick)
        elif options.admit_during_propagation and not quick and "grace_period" not in user:
            # Serving pinned connections after the window means a connection busy at drain
            # start can bring one more request when its stream ends: the budget rule (docs/kubernetes.md) is
            # propagation + 2 x longest request (with queueing) + reserve. 120 s is the value
            # measured to hold at the full default size (0 failures in 10,015 strict requests).
            options = replace(options, grace_period=max(options.grace_period, 120.0))
        if options.handoff_streams and options.gateway is None and scenario != "long-streams-handoff":
            # Handed off, a stream goes on only if its client resumes it: here through graceful's transport.
            options = replace(options, resume=True)
        if scenario in ("long-streams", "long-streams-handoff"):
            # Streams half as long again as the whole (final) grace period: no drain can wait for them.
            options = replace(options, stream_tokens=(int(options.tokens_per_second * options.grace_period * 1.5),))
            if scenario == "long-streams-handoff":
                # ... and need not: they continue on another replica, and the old one exits early.
                options = replace(options, handoff_streams=True, resume=True)
        options.check()
        return options

    def check(self) -> None:
        if self.replicas < 1 or self.updates < 1:
            raise ConfigError(f"--replicas {self.replicas!r} and --updates {self.updates!r} must both be 1 or more")
        if self.concurrency < 2:
            raise ConfigError(f"--concurrency: {self.concurrency!r} is below 2; use 2 or more")
        if self.grace_period <= 0:
            raise ConfigError(f"--grace-period: {self.grace_period!r} must be above 0, e.g. 30s")
        if self.reserve is not None and self.reserve >= self.grace_period:
            raise ConfigError(f"reserve {self.reserve!r} is not below --grace-period {self.grace_period!r}")
        try:  # the budget rule the replicas apply at start-up (docs/middleware.md, "The budget rule")
            Budget.resolve(grace_period=self.grace_period, reserve=self.reserve, propagation_wait=self.propagation_wait)
        except ConfigError as exc:
            raise ConfigError(f"{exc} (here: --propagation-wait and --grace-period)") from None
        if self.propagation_quiet is not None and not 0 < self.propagation_quiet <= self.propagation_wait:
            raise ConfigError(
                f"--propagation-quiet {self.propagation_quiet:g}s must be above 0 and no longer than "
                f"--propagation-wait {self.propagation_wait:g}s; shorten it or lengthen the wait"
            )
        if self.gateway_retry and self.balancer not in L7_BALANCERS:
            raise ConfigError(
                f"--gateway-retry: --balancer {self.balancer} has no L7 retry to turn on; "
                f"use --balancer {' or --balancer '.join(L7_BALANCERS)}"
            )
        for flag, given in (("--envoy-retry", self.envoy_retry is not None), ("--active-hc", self.active_hc)):
            if given and self.balancer != "envoy":
                raise ConfigError(f"{flag} configures Envoy; add --balancer envoy (here: --balancer {self.balancer})")
        if self.gateway_retry and self.envoy_retry not in (None, "not-started"):
            raise ConfigError(
                f"--gateway-retry is --envoy-retry not-started with Envoy, not {self.envoy_retry}; drop one of the two"
            )

    @property
    def retries_refusals(self) -> bool:
        """Whether the balancer retries a not-started 503 on another replica."""
        return self.gateway_retry or self.envoy_retry in ("not-started", "istio-503")

    def with_vllm_model(self) -> Options:
        """With --vllm: the command and the model (made once, in seconds; cached under .vllm/).

        Raises RuntimeError when the model cannot be made.
        """
        if not self.vllm or self.vllm_setup is not None:
            return self
        return replace(self, vllm_setup=prepare(find_vllm()))

    @property
    def longest_stream(self) -> float:
        return max(self.stream_tokens) / self.tokens_per_second

    @property
    def timeout(self) -> float:
        """Each attempt's limit: room for the longest stream twice over."""
        return self.longest_stream * 2 + 15

    def settings(self, kind: Kind, log_dir: str) -> ReplicaSettings:
        return ReplicaSettings(
            kind=kind,
            grace_period=self.grace_period,
            propagation_wait=self.propagation_wait,
            reserve=self.reserve,
            propagation_quiet=self.propagation_quiet,
            admit_during_propagation=self.admit_during_propagation,
            tokens_per_second=self.tokens_per_second,
            load_delay=self.load_delay,
            ignore_term=self.scenario == "ignore-term",
            handoff_streams=self.handoff_streams,
            announce_drain=self.announce_drain,
            admission=self.admission,
            log_dir=log_dir,
            vllm=self.vllm_setup,
        )

    def plan(self, kind: Kind) -> Plan:
        return Plan(
            replicas=self.replicas,
            updates=self.updates,
            lb_delay=self.lb_delay,
            step_pause=self.step_pause,
            prestop=kind == "graceful",
            prestop_hang=self.scenario == "prestop-timeout",
            node_loss=self.scenario == "node-loss",
            executions=self.gateway is None,
        )

    def traffic(self, url: str, headers: Mapping[str, str] | None = None) -> list[SoakConfig]:
        """Short/long requests plus one closed loop per stream length, sharing ``concurrency``; ``headers`` go
        with every request."""
        return [config for _, config in self.client_traffic(url, headers)]

    def client_traffic(self, url: str, headers: Mapping[str, str] | None = None) -> list[tuple[str, SoakConfig]]:
        """``traffic``, each config with its client kind: in short-grace, half the clients retry not-started
        503s (the SDK's policy, no resuming) and half are strict; elsewhere every client is as ``retry`` says."""
        if self.scenario != "short-grace":
            return [(self.retry, config) for config in self._traffic(url, headers)]
        half = replace(self, concurrency=max(2, self.concurrency // 2), resume=False)
        return [
            *((RETRYING, c) for c in replace(half, retry="sdk")._traffic(url, headers)),
            *((STRICT, c) for c in replace(half, retry="none")._traffic(url, headers)),
        ]

    def _traffic(self, url: str, headers: Mapping[str, str] | None = None) -> list[SoakConfig]:
        streams = len(self.stream_tokens)
        plain = max(1, self.concurrency // 2)
        per_stream = max(1, (self.concurrency - plain) // streams)
        common = {
            "url": url,
            "duration": 24 * 3600.0,
            "retry": self.retry,
            "timeout": self.timeout,
            "resume": self.resume,
            "headers": dict(headers or {}),
        }
        if self.vllm:
            # The model's text is unknown: ask for exact lengths and judge answers by them.
            common.update(model=MODEL_NAME, exact_length=True)
        if self.gateway is not None:
            # Raw SSE read with httpx, no resuming transport: the gateway resumes, out of the client's
            # sight, and the count checks what it spliced.
            common.update(model=MODEL, check_count=True)
        if self.resume:
            # A stream longer than the rollout's step may meet several deletions, each handing it
            # off once (a replica refuses continuations once it hands off): one resume per deletion.
            common["max_resumes"] = max(3, self.replicas * self.updates)
        configs = [
            SoakConfig(
                concurrency=plain,
                mix={"short": 60, "long": 40, "stream": 0},
                lengths={"short": self.short_tokens, "long": self.long_tokens},
                seed=self.seed,
                **common,  # type: ignore[arg-type]
            )
        ]
        # Shorter streams get more of the workers, so every length is well represented.
        weights = list(self.stream_weights or [1.0 / (i + 1) for i in range(streams)])
        share = self.concurrency - plain
        for tokens, weight in zip(sorted(self.stream_tokens), weights):
            workers = max(1, round(share * weight / sum(weights))) if streams > 1 else max(1, per_stream)
            configs.append(
                SoakConfig(
                    concurrency=workers,
                    mix={"short": 0, "long": 0, "stream": 1},
                    lengths={"stream": tokens},
                    seed=self.seed,
                    **common,  # type: ignore[arg-type]
                )
            )
        return configs


@dataclass
class SideResult:
    """One side of the table: its soak report and what happened to each old replica."""

    kind: Kind
    balancer: str
    report: SoakReport
    terminations: list[Termination]
    budget_limit: float
    connect_errors: int
    walkaways: int = 0
    handoff_streams: bool = False
    lost_executions: int = 0
    notes: list[str] = field(default_factory=list)
    reloads: list[tuple[float, float]] = field(default_factory=list)  # nginx: reload start, old workers gone
    gateway: str | None = None  # --gateway: what ran in front of the balancer
    admission: str | None = None  # the graceful side's admission option (None: graceful's default)
    client_kinds: dict[str, str] = field(default_factory=dict)  # request id -> its client kind (short-grace)


async def run_side(
    kind: Kind,
    options: Options,
    *,
    log_dir: str,
    log: Callable[[str], None] = print,
    records_path: str | None = None,
) -> SideResult:
    """Start the replicas and the balancer, run traffic through ``updates`` rolling updates, stop everything."""
    if options.vllm and options.vllm_setup is None:
        options = await anyio.to_thread.run_sync(options.with_vllm_model)
    slots = options.replicas * (options.updates + 1) + 2
    async with (
        open_balancer(
            options.balancer,
            slots=slots,
            gateway_retry=options.gateway_retry,
            envoy_retry=options.envoy_retry,
            active_hc=options.active_hc,
        ) as balancer,
        open_gateway(
            options.gateway, balancer_port=balancer.port, log_dir=log_dir, side=_side_name(kind, options)
        ) as gateway,
    ):
        rollout = Rollout(balancer, options.settings(kind, log_dir), options.plan(kind), log=log)
        notes = []
        try:
            await rollout.start()
            log(f"{kind}: {options.replicas} replicas ready behind {balancer.name} on port {balancer.port}")
            url = f"http://127.0.0.1:{balancer.port}"
            if gateway is not None:
                log(f"{kind}: clients send to {gateway.name} on port {gateway.port} (openai/{MODEL}, graceful_resume)")
                url = gateway.url
                # LiteLLM sends the replicas neither the clients' Idempotency-Key nor their request ids.
                notes.append(
                    f"behind {gateway.name} the replicas never see the clients' idempotency keys: "
                    "duplicates are keys with two fresh 2xx answers"
                )
            stop = anyio.Event()
            records: list[RequestRecord] = []
            sink = open(records_path, "w", encoding="utf-8") if records_path else None

            def keep(record: RequestRecord) -> None:
                records.append(record)
                if sink is not None:
                    sink.write(json.dumps(record.to_json()) + "\n")

            started, t0 = time.time(), time.monotonic()
            walkaways = 0
            kinds: dict[str, str] = {}

            def keep_kind(client: str, record: RequestRecord) -> None:
                kinds[record.request_id] = client
                keep(record)

            try:
                async with anyio.create_task_group() as tg:
                    for client, config in options.client_traffic(url, gateway.headers if gateway is not None else None):
                        tg.start_soon(_soak, config, stop, functools.partial(keep_kind, client))
                    if gateway is not None:
                        callers = _node_callers(options, gateway.url, gateway.key, stop, keep)
                        if isinstance(callers, str):
                            log(f"{kind}: no Node SDK callers: {callers}")
                            notes.append(f"no Node SDK callers: {callers}")
                        else:
                            tg.start_soon(callers)
                        tg.start_soon(_responses_callers(options, gateway.url, gateway.key, stop, keep))
                    if options.scenario == "client-disconnect":

                        async def walk() -> None:
                            nonlocal walkaways
                            walkaways = await _walk_away(url, stop, options)

                        tg.start_soon(walk)
                    await anyio.sleep(options.warmup)
                    await rollout.roll()
                    tail = max(1.0, options.warmup / 2)
                    remaining = (options.duration or 0) - (time.monotonic() - t0)
                    await anyio.sleep(max(tail, remaining))
                    stop.set()
            finally:
                if sink is not None:
                    sink.close()
            # vLLM keeps no execution counts, and behind the gateway no count is by the clients' keys:
            # duplicates come from the answers alone.
            executions, lost = (None, 0) if options.vllm or gateway else await _executions(rollout)
            if isinstance(balancer, Envoy):
                await balancer.read_announcements(rollout.terminations)
        finally:
            await rollout.close()
        if lost:
            notes.append(f"execution counts of {lost} SIGKILLed replica(s) died with them")
        report = SoakReport(
            url=url,
            started=started,
            elapsed=time.monotonic() - t0,
            records=sorted(records, key=lambda r: r.start),
            settings={
                "scenario": options.scenario,
                "retry": options.retry,
                "resume": options.resume,
                "gateway": options.gateway,
            },
            executions=executions,
            notes=notes,
        )
        return SideResult(
            kind=kind,
            balancer=balancer.name,
            report=report,
            terminations=rollout.terminations,
            budget_limit=rollout.budget.limit,
            connect_errors=await balancer.backend_connect_errors(),
            walkaways=walkaways,
            reloads=balancer.reload_windows() if isinstance(balancer, Nginx) else [],
            lost_executions=lost,
            notes=notes,
            handoff_streams=options.handoff_streams,
            gateway=gateway.name if gateway is not None else None,
            admission=options.admission,
            client_kinds=kinds,
        )


async def _soak(config: SoakConfig, stop: anyio.Event, keep: Callable[[RequestRecord], None]) -> None:
    await run_soak(config, stop=stop, on_record=keep)


def _node_callers(
    options: Options, url: str, api_key: str, stop: anyio.Event, keep: Callable[[RequestRecord], None]
) -> Callable[[], Coroutine[Any, Any, None]] | str:
    """Behind the gateway: the Node SDK callers of the longest streams to start, or why there are none."""
    missing = missing_node()
    if missing is not None:
        return missing
    return functools.partial(
        node_streams,
        url,
        model=MODEL,
        tokens=max(options.stream_tokens),
        api_key=api_key,
        callers=options.node_streams,
        timeout=options.timeout,
        stop=stop,
        keep=keep,
    )


def _responses_callers(
    options: Options, url: str, api_key: str, stop: anyio.Event, keep: Callable[[RequestRecord], None]
) -> Callable[[], Coroutine[Any, Any, None]]:
    """Behind the gateway: the Responses callers of the longest streams (curl alone where node is missing)."""
    return functools.partial(
        responses_streams,
        url,
        model=MODEL,
        tokens=max(options.stream_tokens),
        api_key=api_key,
        callers=options.responses_streams,
        timeout=options.timeout,
        stop=stop,
        keep=keep,
        node=missing_node() is None,
    )


async def _executions(rollout: Rollout) -> tuple[dict[str, int] | None, int]:
    """Execution counts per idempotency key summed over every replica that ever ran."""
    total: dict[str, int] = {}
    lost = 0
    sources = [t.executions for t in rollout.terminations]
    sources.append(await rollout.executions())
    for counts in sources:
        if counts is None:
            lost += 1
            continue
        for key, count in counts.items():
            total[key] = total.get(key, 0) + count
    return total, lost


async def _walk_away(url: str, stop: anyio.Event, options: Options) -> int:
    """Clients that open a stream, read a few events and leave: they must cost the server nothing."""
    left = 0
    body = {"model": "default", "messages": [{"role": "user", "content": "walk"}], "stream": True}
    body["max_tokens"] = int(options.tokens_per_second * options.longest_stream)
    async with httpx.AsyncClient(timeout=10.0, headers={"user-agent": "graceful-rollout-walkaway"}) as client:
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError):
                async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
                    events = 0
                    async for line in response.aiter_lines():
                        events += line.startswith("data:")
                        if events >= 3:
                            break
                    if events >= 3:
                        left += 1
            await anyio.sleep(0.2)
    return left


def _short_grace(options: Options, user: Mapping[str, Any], *, quick: bool) -> Options:
    """short-grace: the grace period holds a stream already in flight at the drain's start, but not the
    propagation wait and the longest stream: a long stream admitted late in the wait is cut (admission all)
    unless it is refused (admission fits). The balancer keeps sending for most of the wait (a slow endpoint
    removal), and most stream workers ask for the longest streams, so that drains see them arrive late.
    Drains do not overlap (the step pause is longer than the budget), so each refusal has one deadline."""
    if quick:
        # 20 tokens/s: streams of 1 and 8 s; 10 s to the deadline, a wait of 4 s, sent to for 3.5 s.
        sizes: dict[str, Any] = dict(
            grace_period=12.0, reserve=2.0, propagation_wait=4.0, lb_delay=3.5, stream_tokens=(20, 160), step_pause=11.0
        )
    else:
        # 10 tokens/s: streams of 1 and 24 s; 28 s to the deadline, a wait of 12 s, sent to for 11 s.
        sizes = dict(
            grace_period=30.0,
            reserve=2.0,
            propagation_wait=12.0,
            lb_delay=11.0,
            stream_tokens=(10, 240),
            replicas=3,
            updates=2,
            step_pause=30.0,
        )
    sizes["stream_weights"] = (1.0, 3.0)
    return replace(options, **{key: value for key, value in sizes.items() if key not in user})


def _side_name(kind: Kind, options: Options) -> str:
    return f"{kind}-handoff" if options.handoff_streams else kind


def records_file(directory: str | None, kind: str) -> str | None:
    """Where ``--records DIR`` puts one side's JSON lines."""
    if directory is None:
        return None
    os.makedirs(directory, exist_ok=True)
    return os.path.join(directory, f"{kind}.jsonl")
