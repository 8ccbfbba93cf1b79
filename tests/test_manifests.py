"""The Kubernetes manifests in examples/kubernetes: budgets add up, probes hit real paths, hooks parse."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import httpx
import pytest
import yaml  # type: ignore[import-untyped]

from examples.server import Config, create_app
from graceful import Budget, parse_duration
from graceful._asgi._options import DECLARED, DEFAULTS
from graceful._drain._environ import Given

pytestmark = pytest.mark.anyio

MANIFESTS = sorted((Path(__file__).parent.parent / "examples" / "kubernetes").glob("*.yaml"))
EXAMPLE_APP = "examples.server:app"
GATEWAY_APP = "litellm.proxy.proxy_server:app"
MIDDLEWARE = "graceful.GracefulMiddleware"
PROBES = {"startupProbe": "startup_path", "readinessProbe": "ready_path", "livenessProbe": "live_path"}


def load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def pod_specs(node: object) -> Iterator[dict[str, Any]]:
    """Every pod spec in a document, wherever the workload kind nests it."""
    if isinstance(node, dict):
        if isinstance(node.get("containers"), list):
            yield node
        for value in node.values():
            yield from pod_specs(value)
    elif isinstance(node, list):
        for item in node:
            yield from pod_specs(item)


def containers() -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    for path in MANIFESTS:
        for doc in load(path):
            for spec in pod_specs(doc):
                for container in spec["containers"]:
                    yield path.name, spec, container


def argv(container: dict[str, Any]) -> list[str]:
    return [str(a) for a in (*container.get("command", ()), *container.get("args", ()))]


def option(args: list[str], name: str) -> str | None:
    for index, arg in enumerate(args):
        if arg == name and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def prestop(container: dict[str, Any]) -> list[str]:
    return [str(a) for a in container["lifecycle"]["preStop"]["exec"]["command"]]


def graceful_cli() -> Any:
    import graceful.cli

    return graceful.cli


def drain_params(command: list[str]) -> dict[str, Any]:
    assert Path(command[0]).name == "graceful" and command[1] == "drain", f"not a graceful drain: {command}"
    cli = graceful_cli()
    with cli.drain_command.make_context("drain", command[2:]) as ctx:  # raises on an option that does not parse
        return dict(ctx.params)


def env(container: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: str(item.get("value", "")) for item in container.get("env", ())}


ALL = list(containers())


def test_every_manifest_parses_and_is_found() -> None:
    names = {path.name for path in MANIFESTS}
    assert names >= {
        "deployment.yaml",
        "service.yaml",
        "pdb.yaml",
        "vllm.yaml",
        "vllm-middleware.yaml",
        "kthena-modelserving.yaml",
        "kthena-modelserving-pd.yaml",
        "litellm-gateway.yaml",
    }
    kinds = {doc["kind"] for path in MANIFESTS for doc in load(path)}
    assert kinds == {"Deployment", "Service", "PodDisruptionBudget", "ModelServing", "ConfigMap"}
    for path in MANIFESTS:
        for doc in load(path):
            if doc["kind"] == "ModelServing":
                assert doc["apiVersion"] == "workload.serving.volcano.sh/v1alpha1"
    # example server, vLLM (engine mode), vLLM (middleware), kthena aggregated, kthena prefill and decode,
    # the LiteLLM gateway
    assert len(ALL) == 7


@pytest.mark.parametrize(("name", "spec", "container"), ALL, ids=[f"{n}:{c['name']}" for n, _, c in ALL])
def test_grace_period_covers_propagation_drain_and_reserve(
    name: str, spec: dict[str, Any], container: dict[str, Any]
) -> None:
    grace = parse_duration(spec["terminationGracePeriodSeconds"])
    assert env(container)["GRACEFUL_GRACE_PERIOD"] == str(spec["terminationGracePeriodSeconds"])
    params = drain_params(prestop(container))
    assert params["timeout"] is not None, f"{name}: the preStop drain needs an explicit --timeout"
    reserve_env = env(container).get("GRACEFUL_EXAMPLE_RESERVE")
    wait = params["propagation_wait"] or 0.0
    budget = Budget.resolve(
        grace_period=grace, reserve=reserve_env, drain_timeout=params["timeout"], propagation_wait=wait
    )
    kv_buffer = params.get("kv_buffer") or 0.0
    if params.get("engine"):
        needed = wait + params["timeout"] + kv_buffer + budget.reserve
        assert needed <= grace, f"{name}: {wait} + {params['timeout']} + {kv_buffer} + {budget.reserve} > {grace}"
        # Engine mode waits min(--timeout, 70% of --grace-period): the hook must fit in it.
        assert parse_duration(params["grace_period"]) == grace
        assert wait + params["timeout"] + kv_buffer <= 0.7 * grace
        assert kv_buffer <= 30
    elif GATEWAY_APP in argv(container):
        # The gateway relays the example replicas' streams (600 tokens at 20 per second, plus a continuation's
        # pause and prefill): its drain waits for the longest, in the mode it serves.
        settings = env(container)
        assert params["timeout"] + budget.reserve <= grace, f"{name}: {params['timeout']} + {budget.reserve} > {grace}"
        assert budget.longest_covered(admit=True) >= 30
        assert parse_duration(settings["GRACEFUL_DRAIN_TIMEOUT"]) == params["timeout"]
        assert parse_duration(settings["GRACEFUL_PROPAGATION_WAIT"]) == wait
        # LiteLLM's own shutdown budget counts from SIGTERM: at least the drain limit and 10 s for its flush.
        assert float(settings["GRACEFUL_SHUTDOWN_TIMEOUT"]) >= params["timeout"] + 10
    elif MIDDLEWARE in argv(container):
        # vLLM with graceful inside: the hook and a SIGTERM-started drain end at the same time.
        settings = env(container)
        assert params["timeout"] + budget.reserve <= grace, f"{name}: {params['timeout']} + {budget.reserve} > {grace}"
        assert parse_duration(settings["GRACEFUL_DRAIN_TIMEOUT"]) == params["timeout"]
        assert parse_duration(settings["GRACEFUL_PROPAGATION_WAIT"]) == wait
    else:
        # The deadline counts from drain start, the propagation wait inside it: the hook's
        # --timeout must fit before the reserve, and cover the longest request in the mode served.
        assert params["timeout"] + budget.reserve <= grace, f"{name}: {params['timeout']} + {budget.reserve} > {grace}"
        settings = env(container)
        generation = int(settings["GRACEFUL_EXAMPLE_MAX_TOKENS"]) / float(
            settings["GRACEFUL_EXAMPLE_TOKENS_PER_SECOND"]
        )
        # The queue is no longer than the slots: a queued request waits at most one generation.
        assert int(settings["GRACEFUL_EXAMPLE_QUEUE_SIZE"]) <= int(settings["GRACEFUL_EXAMPLE_SLOTS"])
        longest = 2 * generation
        admit = "--no-admit-during-propagation" not in container["command"]
        covered = budget.longest_covered(admit=admit)
        assert covered >= longest, f"{name}: the budget covers requests of {covered:g}s, the longest is {longest:g}s"
        # The server's own deadline (SIGTERM without the hook) matches the hook's.
        assert parse_duration(env(container)["GRACEFUL_EXAMPLE_DRAIN_TIMEOUT"]) == params["timeout"]
        assert parse_duration(env(container)["GRACEFUL_EXAMPLE_PROPAGATION_WAIT"]) == wait


def test_prefill_holds_a_kv_buffer_and_decode_does_not() -> None:
    doc = load(next(p for p in MANIFESTS if p.name == "kthena-modelserving-pd.yaml"))[0]
    roles = {role["name"]: role for role in doc["spec"]["template"]["roles"]}
    buffers = {
        name: drain_params(prestop(role["entryTemplate"]["spec"]["containers"][0]))["kv_buffer"]
        for name, role in roles.items()
    }
    assert buffers["prefill"] > 0
    assert not buffers["decode"]


def served_port(container: dict[str, Any]) -> int:
    port = option(argv(container), "--port")
    return int(port) if port is not None else 8000  # graceful run's and vLLM's default


def probe_port(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    named = {p["name"]: p["containerPort"] for p in container.get("ports", ()) if "name" in p}
    assert port in named, f"probe port {port!r} is not a named container port"
    return int(named[port])


@pytest.mark.parametrize(("name", "spec", "container"), ALL, ids=[f"{n}:{c['name']}" for n, _, c in ALL])
def test_probe_ports_match_the_served_port(name: str, spec: dict[str, Any], container: dict[str, Any]) -> None:
    probes = [container[key] for key in PROBES if key in container]
    assert probes, f"{name}: no probes"
    for probe in probes:
        assert probe_port(container, probe["httpGet"]["port"]) == served_port(container)


async def test_example_probes_use_paths_the_server_serves() -> None:
    deployment = [c for n, _, c in ALL if EXAMPLE_APP in argv(c)]
    assert len(deployment) == 1
    container = deployment[0]
    app = create_app(Config(load_delay=0.0), admin=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://pod") as http:
        for key, parameter in PROBES.items():
            path = container[key]["httpGet"]["path"]
            assert path == DEFAULTS[parameter]
        app.drain.mark_serving()
        for key in PROBES:
            # Answered by the middleware with its probe body; any other path reaches the app.
            response = await http.get(container[key]["httpGet"]["path"])
            assert response.status_code == 200
            assert response.json()["state"] == "SERVING"
        assert (await http.get("/not-a-probe")).status_code == 404


def test_vllm_with_the_middleware_probes_it_and_keeps_its_own_pages() -> None:
    """Readiness and startup are the middleware's (read from its defaults, as vLLM loads it with no
    arguments); liveness is vLLM's /health, exempt from refusal with /metrics; the logging file
    the environment names is the one the ConfigMap mounts."""
    (container,) = [c for _, _, c in ALL if MIDDLEWARE in argv(c)]
    args = argv(container)
    assert option(args, "--middleware") == MIDDLEWARE
    assert container["readinessProbe"]["httpGet"]["path"] == DEFAULTS["ready_path"]
    assert container["startupProbe"]["httpGet"]["path"] == DEFAULTS["startup_path"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    exempt = Given(DECLARED, env(container), {}).settle(["exempt_paths"])["exempt_paths"]
    assert set(exempt) >= {"/health", "/metrics"}
    (mount,) = container["volumeMounts"]
    assert env(container)["VLLM_LOGGING_CONFIG_PATH"].startswith(mount["mountPath"] + "/")
    (config,) = [
        doc
        for path in MANIFESTS
        for doc in load(path)
        if doc["kind"] == "ConfigMap" and "vllm-logging.json" in doc["data"]
    ]
    logging_config = json.loads(config["data"]["vllm-logging.json"])
    assert set(logging_config["loggers"]) == {"vllm", "graceful"}
    shipped = json.loads((Path(__file__).parent.parent / "examples" / "vllm" / "logging.json").read_text())
    assert logging_config["loggers"] == shipped["loggers"]


def test_server_command_is_a_graceful_run_that_parses() -> None:
    cli = graceful_cli()
    (container,) = [c for _, _, c in ALL if EXAMPLE_APP in argv(c)]
    args = argv(container)
    assert args[:2] == ["graceful", "run"]
    run = cli.cli.get_command(click.Context(cli.cli), "run")
    assert run is not None
    with run.make_context("run", args[2:]) as ctx:
        assert ctx.params["app"] == EXAMPLE_APP
        assert ctx.params["port"] == container["ports"][0]["containerPort"]


def test_a_bad_prestop_option_would_be_caught() -> None:
    graceful_cli()
    with pytest.raises(click.UsageError):
        drain_params(["graceful", "drain", "--propagation-wait=10 seconds"])
    with pytest.raises(click.UsageError):
        drain_params(["graceful", "drain", "--no-such-option"])


def test_rollout_strategy_and_spread() -> None:
    (deployment,) = [d for d in load(MANIFESTS[[p.name for p in MANIFESTS].index("deployment.yaml")])]
    strategy = deployment["spec"]["strategy"]["rollingUpdate"]
    assert (strategy["maxSurge"], strategy["maxUnavailable"]) == (1, 0)
    anti = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    terms = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert terms[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    for path in ("service.yaml", "pdb.yaml"):
        (doc,) = load(MANIFESTS[[p.name for p in MANIFESTS].index(path)])
        selector = doc["spec"]["selector"]
        selector = selector.get("matchLabels", selector)
        assert selector.items() <= labels.items()
    (pdb,) = load(MANIFESTS[[p.name for p in MANIFESTS].index("pdb.yaml")])
    assert pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]


def test_every_sglang_drained_by_its_preset_serves_metrics() -> None:
    """SGLang has /metrics only with --enable-metrics: the engine page's pods (docs_src/engines/, which
    docs/engines.md includes) and the manifests must start it so."""
    pods = sorted((Path(__file__).parent.parent / "docs_src" / "engines").glob("*.yaml"))
    snippets = [yaml.safe_load(path.read_text()) for path in pods]
    sources = [*snippets, *(doc for path in MANIFESTS for doc in load(path))]
    engines = []
    for source in sources:
        for spec in pod_specs(source):
            for container in spec["containers"]:
                if "lifecycle" not in container:
                    continue
                engine = drain_params(prestop(container))["engine"]
                engines.append(engine)
                if engine == "sglang":
                    assert "--enable-metrics" in argv(container), container["name"]
    assert "sglang" in engines and "vllm" in engines


def test_the_gateway_resumes_its_opted_in_deployments_and_answers_graceful_probes() -> None:
    """The gateway's config loads graceful's handler as a list entry (a string would replace LiteLLM's own
    callbacks), opts its deployment in, and its probes are graceful's (LiteLLM fails its own from SIGTERM on)."""
    (doc,) = [d for d in load(Path(MANIFESTS[0]).parent / "litellm-gateway.yaml") if d["kind"] == "ConfigMap"]
    config = yaml.safe_load(doc["data"]["config.yaml"])
    assert config["litellm_settings"]["callbacks"] == ["graceful.integrations.litellm.handler"]
    handler = Path(__file__).parent.parent / "graceful" / "integrations" / "litellm.py"
    assert "\nhandler = " in handler.read_text()
    assert all(entry["model_info"]["graceful_resume"] is True for entry in config["model_list"])
    (container,) = [c for _, _, c in ALL if GATEWAY_APP in argv(c)]
    assert {key: container[key]["httpGet"]["path"] for key in PROBES} == {
        key: DEFAULTS[option] for key, option in PROBES.items()
    }
    assert env(container)["CONFIG_FILE_PATH"].startswith(container["volumeMounts"][0]["mountPath"] + "/")
