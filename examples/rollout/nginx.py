"""nginx in front of the replicas, configured as ingress-nginx configures its upstreams.

HTTP/1.1 to the upstreams with ``keepalive 32`` idle connections per worker and the
``Connection`` header cleared, ``proxy_next_upstream error timeout`` with 3 tries, no
passive health marking (``max_fails=0``: ingress-nginx's Lua balancer does not mark
endpoints down either), unbuffered responses so that streams flow. Directives:
http://nginx.org/en/docs/http/ngx_http_upstream_module.html and ngx_http_proxy_module.html.

An endpoint leaves nginx as it leaves ingress-nginx's view of a Service: the upstream
list is rewritten and the master reloads (SIGHUP, what ``nginx -s reload`` sends). New
workers serve new requests from then on; the old ones finish what they hold and exit.
``gateway_retry`` adds the documented retry of a not-started 503:
``proxy_next_upstream error timeout http_503 non_idempotent``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

from .processes import find_binary, listening_socket, stop_group

__all__ = ["NGINX_ENV", "Nginx", "find_nginx"]

NGINX_ENV = "GRACEFUL_ROLLOUT_NGINX"
RETRY_DEFAULT = "error timeout"
RETRY_GATEWAY = "error timeout http_503 non_idempotent"
WORKERS_STARTED = "start worker processes"


def find_nginx() -> str | None:
    """The nginx binary (``GRACEFUL_ROLLOUT_NGINX`` names another one, ``off`` hides it)."""
    return find_binary("nginx", NGINX_ENV)


class Nginx:
    """An nginx master process (``daemon off``) whose upstream list follows ``add`` and ``remove``."""

    def __init__(self, binary: str, directory: str, *, gateway_retry: bool = False) -> None:
        self.binary = binary
        self.directory = directory
        self.gateway_retry = gateway_retry
        self.port = 0
        self.name = "nginx"
        self.config_path = os.path.join(directory, "nginx.conf")
        self.error_log = os.path.join(directory, "error.log")
        self._servers: dict[str, int] = {}
        self._process: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()
        self._retired: list[tuple[float, list[str]]] = []  # per reload: its wall-clock time, the old workers

    def config(self) -> str:
        d = self.directory
        # nginx refuses an upstream without servers; a server marked down stands in for none.
        servers = [f"        server 127.0.0.1:{port} max_fails=0;" for port in self._servers.values()]
        upstream = "\n".join(servers) or "        server 127.0.0.1:9 down;"
        retry = RETRY_GATEWAY if self.gateway_retry else RETRY_DEFAULT
        return f"""daemon off;
master_process on;
worker_processes 1;
pid {d}/nginx.pid;
error_log {self.error_log} notice;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    upstream pods {{
{upstream}
        keepalive 32;
    }}
    server {{
        listen 127.0.0.1:{self.port};
        client_max_body_size 8m;
        location / {{
            proxy_pass http://pods;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_next_upstream {retry};
            proxy_next_upstream_tries 3;
        }}
    }}
}}
"""

    async def start(self) -> None:
        sock = listening_socket()
        try:
            self.port = int(sock.getsockname()[1])
            self._write()
            with open(self.error_log, "w", encoding="utf-8"):
                pass
            fd = sock.fileno()
            self._process = await asyncio.create_subprocess_exec(
                self.binary,
                "-e",
                self.error_log,
                "-p",
                self.directory,
                "-c",
                self.config_path,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                pass_fds=(fd,),
                env={**os.environ, "NGINX": f"{fd};"},
                start_new_session=True,
            )
        finally:
            sock.close()  # nginx holds its own copy
        await self._workers_started(1)
        self.name = f"nginx {_version(self.log_text())} (ingress-nginx upstream settings" + (
            ", gateway retry)" if self.gateway_retry else ")"
        )

    def _write(self) -> None:
        with open(self.config_path, "w", encoding="utf-8") as out:
            out.write(self.config())

    def log_text(self) -> str:
        """The error log so far (notice level: starts, reloads, upstream errors)."""
        with open(self.error_log, encoding="utf-8", errors="replace") as log:
            return log.read()

    async def _workers_started(self, count: int, *, since: int = 0) -> None:
        """Wait until the master has logged its ``count``-th worker start (or an [emerg] after ``since``)."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            log = self.log_text()
            if "[emerg]" in log[since:]:
                raise RuntimeError(f"nginx refused its configuration: {log[since:].strip()[-500:]}")
            if log.count(WORKERS_STARTED) >= count:
                return
            assert self._process is not None
            if self._process.returncode is not None:
                raise RuntimeError(f"nginx exited with {self._process.returncode}: {log.strip()[-500:]}")
            await asyncio.sleep(0.01)
        raise RuntimeError(f"nginx did not start its workers within 10 s (config {self.config_path})")

    async def _reload(self) -> None:
        """Rewrite the upstreams and reload; returns when the new workers run and the old ones stopped taking work.

        The master logs the new workers' start before it tells the old ones to quit; an old
        worker still serves a request already on its way, so this waits for each old
        worker's "gracefully shutting down" (it has closed its listener and idle connections).
        """
        assert self._process is not None
        log = self.log_text()
        old = _workers(log)
        self._write()
        self._retired.append((time.time(), old))
        os.kill(self._process.pid, signal.SIGHUP)
        await self._workers_started(log.count(WORKERS_STARTED) + 1, since=len(log))
        deadline = time.monotonic() + 10
        while not all(f"{pid}#{pid}: gracefully shutting down" in self.log_text() for pid in old):
            if time.monotonic() > deadline:
                raise RuntimeError(f"nginx: old workers {old} did not begin their shutdown within 10 s")
            await asyncio.sleep(0.01)

    async def add(self, endpoint: str, port: int) -> None:
        async with self._lock:
            self._servers[endpoint] = port
            await self._reload()

    async def remove(self, endpoint: str) -> None:
        async with self._lock:
            if self._servers.pop(endpoint, None) is not None:
                await self._reload()

    def endpoints(self) -> list[str]:
        return list(self._servers)

    async def backend_connect_errors(self) -> int:
        """Upstream connects that failed (nginx logs each one, retried or not)."""
        return sum(
            1
            for line in self.log_text().splitlines()
            if "connect() failed" in line and "while connecting to upstream" in line
        )

    def reload_windows(self) -> list[tuple[float, float]]:
        """Per reload, the wall-clock span from the SIGHUP until its old workers had exited.

        While an old worker exits it closes every client connection it holds, idle or just
        done with a response that promised keep-alive; a request a client sends on one of
        them at that instant is lost (no response), whatever the replicas do. The log has
        1 s resolution, hence the extra second; a worker still running ends its span now.
        """
        exits: dict[str, float] = {}
        for line in self.log_text().splitlines():
            _, found, rest = line.partition(": worker process ")
            if found and " exited" in rest:
                with contextlib.suppress(ValueError):
                    exits[rest.split()[0]] = time.mktime(time.strptime(line[:19], "%Y/%m/%d %H:%M:%S")) + 1.0
        now = time.time()
        return [(start, max((exits.get(pid, now) for pid in old), default=start)) for start, old in self._retired]

    async def close(self) -> None:
        await stop_group(self._process)


def _workers(log: str) -> list[str]:
    """Pids of the workers started by the last (re)configuration."""
    last = log.rfind(WORKERS_STARTED)
    if last < 0:
        return []
    return [line.rsplit(" ", 1)[-1] for line in log[last:].splitlines() if "start worker process " in line]


def _version(log: str) -> str:
    for line in log.splitlines():
        _, found, rest = line.partition("nginx/")
        if found and rest[:1].isdigit():
            return rest.split()[0]
    return "?"
