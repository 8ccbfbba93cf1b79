"""``python -m examples.rollout``: the same rolling update twice, baseline then graceful, and the table.

Exit codes: 0 the graceful side kept its promises for the scenario, 1 it did not,
2 bad options, 3 the demo itself could not run (a replica or the balancer failed).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from dataclasses import replace
from typing import Any

import click

from graceful import ConfigError, parse_duration

from . import short_grace
from .advice import advise
from .balancer import BALANCERS
from .envoy import RETRIES
from .litellm import GATEWAYS
from .report import expectations, render, side_summary
from .scenarios import SCENARIOS, Options, SideResult, records_file, run_side

__all__ = ["main", "rollout_command"]

EXIT_OK, EXIT_BROKEN, EXIT_USAGE, EXIT_FAILED = 0, 1, 2, 3


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value, name=f"--{param.name}".replace("_", "-"))
    except ConfigError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command("rollout", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--scenario", type=click.Choice(SCENARIOS), default="default", show_default=True, help="What goes wrong.")
@click.option("--replicas", type=click.IntRange(min=1), default=None, help="Replicas [default 3; --quick 2].")
@click.option("--updates", type=click.IntRange(min=1), default=None, help="Rolling updates [default 3; --quick 1].")
@click.option(
    "--duration", callback=_duration, help="Send traffic at least this long [default: until the rollout ends]."
)
@click.option("--retry", type=click.Choice(["none", "sdk"]), default=None, help="Client retries [default sdk].")
@click.option(
    "--admit-during-propagation/--no-admit-during-propagation",
    default=None,
    help="Graceful side serves new requests during the propagation wait [default: admit; --no-...: refuse].",
)
@click.option(
    "--grace-period",
    callback=_duration,
    help="terminationGracePeriodSeconds [default 45s, 120s admitting at full size; --quick 10s].",
)
@click.option("--propagation-wait", callback=_duration, help="preStop propagation wait [default 3s; --quick 1s].")
@click.option(
    "--propagation-quiet",
    callback=_duration,
    help="preStop --propagation-quiet: end the wait once requests stop [default off; observed-propagation: 2s].",
)
@click.option("--lb-delay", callback=_duration, help="Endpoint removal delay [default 1s; lb-delay-30s: 30s].")
@click.option("--concurrency", type=click.IntRange(min=2), default=None, help="Clients in flight [default 56].")
@click.option(
    "--balancer",
    type=click.Choice(BALANCERS),
    default="auto",
    show_default=True,
    help="auto: HAProxy mode tcp when installed, else the embedded forwarder; L7: haproxy-http, nginx, envoy.",
)
@click.option(
    "--gateway-retry",
    is_flag=True,
    default=None,
    help="L7 balancer retries a not-started 503 on another replica, even for POST (the documented config).",
)
@click.option(
    "--envoy-retry",
    type=click.Choice(RETRIES),
    default=None,
    help="--balancer envoy: its retry profile [default none, as Envoy Gateway; not-started with --gateway-retry].",
)
@click.option(
    "--active-hc", is_flag=True, default=None, help="--balancer envoy: active health checking of /ready every 30 s."
)
@click.option(
    "--announce-drain/--no-announce-drain",
    default=None,
    help="Graceful side: responses carry x-envoy-immediate-health-check-fail from the drain's start [default: on].",
)
@click.option(
    "--handoff-streams",
    is_flag=True,
    default=None,
    help=(
        "Graceful side: hand resumable streams off after the propagation wait (graceful run --handoff-streams); "
        "the first column is the same side without it. Clients resume them through graceful's transport, "
        "or the gateway does."
    ),
)
@click.option(
    "--admission",
    type=click.Choice(["all", "fits"]),
    default=None,
    help=(
        "Graceful side: graceful run --admission [default: graceful's, fits]. In short-grace the first "
        "column is admission all and the second admission fits, unless this is given."
    ),
)
@click.option(
    "--gateway",
    type=click.Choice(GATEWAYS),
    default=None,
    help=(
        "Clients send to a LiteLLM proxy in front of the balancer (bash scripts/setup-litellm), which resumes "
        "the streams: raw SSE readers and Node openai SDK callers. Streams of 1, 5 and 30 s (--quick: 15 s)."
    ),
)
@click.option("--skip-baseline", is_flag=True, help="Run the graceful side only.")
@click.option("--records", type=click.Path(file_okay=False), default=None, help="Write per-request JSON lines here.")
@click.option("--report", type=click.Path(dir_okay=False), default=None, help="Write both sides as JSON here.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="Timeline PNG (needs matplotlib).")
@click.option("--quick", is_flag=True, help="The reduced CI version: 2 replicas, 1 update, short streams.")
@click.option(
    "--vllm",
    is_flag=True,
    help=(
        "Replicas are real vllm serve processes (CPU, a tiny model made once; bash scripts/setup-vllm), "
        "the graceful side with --middleware graceful.GracefulMiddleware. Requests ask for exact lengths "
        "(ignore_eos). Defaults: 2 replicas (--quick 1), 1 update, concurrency 12 (--quick 6), "
        "short 8 and long 256 tokens, streams 256/1024/4096 tokens (--quick 256/1024), "
        "grace period 120s (--quick 30s with a 5s reserve). Scenarios default and strict-clients."
    ),
)
@click.option("--seed", type=int, default=None, help="Seed for the traffic mix.")
def rollout_command(
    scenario: str,
    skip_baseline: bool,
    records: str | None,
    report: str | None,
    plot: str | None,
    quick: bool,
    vllm: bool,
    gateway: str | None,
    **given: Any,
) -> None:
    """Roll N replicas of the example server (or vLLM) behind a real balancer, baseline vs graceful, under traffic."""
    try:
        options = Options.resolve(scenario=scenario, quick=quick, vllm=vllm, gateway=gateway, **given)
        if plot is not None:
            from graceful._soak._report import check_plotting

            check_plotting()
    except ConfigError as exc:
        click.echo(f"rollout: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    try:
        admission_given = given.get("admission") is not None
        if scenario == "short-grace" and not skip_baseline and not admission_given:
            options = replace(options, admission="fits")  # the second column; the first is admission all
        outcome = asyncio.run(_run(options, skip_baseline, records, admission_given))
    except RuntimeError as exc:
        click.echo(f"rollout: the demo could not run: {exc}", err=True)
        sys.exit(EXIT_FAILED)
    except KeyboardInterrupt:
        click.echo("rollout: interrupted; every replica and the balancer were stopped", err=True)
        sys.exit(130)
    baseline, graceful, log_dir = outcome
    base = side_summary(baseline, options) if baseline is not None else None
    grace = side_summary(graceful, options)
    click.echo("")
    click.echo(render(base, grace, options))
    kinds = short_grace.sides(baseline, graceful) if options.scenario == "short-grace" else []
    if kinds:
        click.echo("")
        click.echo("Per client kind (answers lost at a drain's deadline, refusals, retries):")
        for line in short_grace.render_kinds(kinds):
            click.echo(f"  {line}")
    advice_lines, advice = advise(graceful, options, log_dir)
    if advice_lines:
        click.echo("")
        click.echo("The graceful side's own traffic, as its old replicas counted it (graceful advise --from):")
        for line in advice_lines:
            click.echo(f"  {line}")
    broken = expectations(grace, options)
    if options.scenario == "short-grace" and kinds:
        broken.extend(short_grace.broken(kinds[-1][1]) if graceful.admission == "fits" else [])
    if broken:
        click.echo(f"graceful: FAILED its promise for {scenario}: {', '.join(broken)} (replica logs in {log_dir})")
    else:
        click.echo(f"graceful: kept its promise for {scenario}.")
    if report is not None:
        with open(report, "w", encoding="utf-8") as out:
            document = {"scenario": scenario, "baseline": base, "graceful": grace, "broken": broken, "advice": advice}
            if kinds:
                document["kinds"] = {label: counts.as_dict() for label, counts in kinds}
            json.dump(document, out, indent=2)
    if plot is not None:
        from graceful._soak._report import write_plot

        write_plot(graceful.report, plot)
        if baseline is not None:
            stem, ext = os.path.splitext(plot)
            write_plot(baseline.report, f"{stem}-baseline{ext or '.png'}")
    sys.exit(EXIT_BROKEN if broken else EXIT_OK)


async def _run(
    options: Options, skip_baseline: bool, records: str | None, admission_given: bool = False
) -> tuple[SideResult | None, SideResult, str]:
    log_dir = tempfile.mkdtemp(prefix="graceful-rollout-")

    def log(line: str) -> None:
        click.echo(line, err=True)

    if options.vllm:
        options = await asyncio.to_thread(options.with_vllm_model)
        assert options.vllm_setup is not None
        log(f"vllm: {options.vllm_setup.command}, model {options.vllm_setup.model}")
    baseline = None
    server = "vllm serve" if options.vllm else "uvicorn"
    if not skip_baseline and options.scenario == "short-grace" and not admission_given:
        # The column to compare with: the same graceful side admitting every request (admission all).
        log("admission all: graceful run --admission all + preStop graceful drain")
        compare = replace(options, admission="all")
        baseline = await run_side(
            "graceful", compare, log_dir=log_dir, log=log, records_path=records_file(records, "admission-all")
        )
        options = replace(options, admission="fits")
    elif not skip_baseline and options.handoff_streams:
        # The column to compare with: the same graceful side without handoff (in long-streams-handoff: long-streams).
        if options.scenario == "long-streams-handoff":
            name, waited = "long-streams", "until the deadline"
        else:
            name, waited = "no-handoff", "until they end or the deadline"
        log(f"{name}: graceful run + preStop graceful drain, streams waited for {waited}")
        compare = replace(options, handoff_streams=False, resume=False)
        baseline = await run_side(
            "graceful", compare, log_dir=log_dir, log=log, records_path=records_file(records, name)
        )
    elif not skip_baseline:
        log(f"baseline: plain {server}, no preStop hook")
        baseline = await run_side(
            "baseline", options, log_dir=log_dir, log=log, records_path=records_file(records, "baseline")
        )
    inside = "vllm serve --middleware graceful.GracefulMiddleware" if options.vllm else "graceful run"
    log(
        f"graceful: {inside} + preStop graceful drain"
        + (", streams handed off" if options.handoff_streams else "")
        + (f", admission {options.admission}" if options.admission is not None else "")
    )
    graceful = await run_side(
        "graceful", options, log_dir=log_dir, log=log, records_path=records_file(records, "graceful")
    )
    return baseline, graceful, log_dir


def main(argv: list[str] | None = None) -> None:
    rollout_command.main(args=argv, prog_name="python -m examples.rollout")
