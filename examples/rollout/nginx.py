"""nginx in front of the replicas, configured as ingress-nginx configures its upstreams.

HTTP/1.1 to the upstreams with ``keepalive 32`` idle connections per worker and the
``Connection`` header cleared, ``proxy_next_upstream error timeout`` with 3 tries, no
passive health marking (``max_fails=0``: ingress-nginx's Lua balancer does not mark
endpoints down either), unbuffered responses so that streams flow. Directives:
http://nginx.org/en/docs/http/ngx_http_upstream_module.html and ngx_http_proxy_module.html.

An endpoint leaves nginx as it leaves ingress-nginx's: without a reload. ingress-nginx
balances in Lua (``balancer_by_lua_block`` over one placeholder server, ``keepalive`` on the
upstream, ``set_more_tries(1)`` before ``set_current_peer`` on each try; upstream
rootfs/etc/nginx/lua/balancer.lua) and its controller posts the endpoint list into a shared
dict. This emulation does the same with nginx's Lua module (Debian package
``libnginx-mod-http-lua``): the demo puts the list to a control location on a Unix socket
and the next request's balancing sees it. The workers and the client connections they hold
stay as they are.

Without the Lua module (or with ``GRACEFUL_ROLLOUT_NGINX_LUA=off``) the upstream list is
rewritten and the master reloads (SIGHUP, what ``nginx -s reload`` sends). New workers
serve new requests from then on; the old ones finish what they hold, close the client
connections they keep alive, and exit: a request a client sends on one of those at that
instant gets no answer, whatever the replicas do.
``gateway_retry`` runs the documented location, examples/gateways/nginx-retry.conf, as written:
it retries a not-started 503 (``proxy_next_upstream error timeout http_503 non_idempotent``).
Without it the same location runs with nginx's default retry, ``error timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time

from .processes import documented_lines, find_binary, listening_socket, stop_group

__all__ = ["NGINX_ENV", "Nginx", "find_nginx"]

NGINX_ENV = "GRACEFUL_ROLLOUT_NGINX"
LUA_ENV = "GRACEFUL_ROLLOUT_NGINX_LUA"
RETRY_DEFAULT = "error timeout"
RETRY_GATEWAY = "error timeout http_503 non_idempotent"
WORKERS_STARTED = "start worker processes"
LOCATION = "nginx-retry.conf"


def location(*, gateway_retry: bool) -> str:
    """The documented location (examples/gateways/nginx-retry.conf), or without its retry of a 503."""
    documented = f"proxy_next_upstream {RETRY_GATEWAY};"
    lines = documented_lines(LOCATION)
    if not any(line.strip() == documented for line in lines):
        raise RuntimeError(f"examples/gateways/{LOCATION} has no line {documented!r}")
    text = "\n".join(" " * 8 + line for line in lines)
    return text if gateway_retry else text.replace(documented, f"proxy_next_upstream {RETRY_DEFAULT};")


def find_nginx() -> str | None:
    """The nginx binary (``GRACEFUL_ROLLOUT_NGINX`` names another one, ``off`` hides it)."""
    return find_binary("nginx", NGINX_ENV)


def lua_modules(binary: str) -> list[str]:
    """The module files that give ``binary`` the Lua balancer, in load order; [] when absent.

    ``GRACEFUL_ROLLOUT_NGINX_LUA=off`` returns [] (endpoint changes by reload instead).
    """
    if os.environ.get(LUA_ENV, "").strip().lower() in ("off", "0", "no", "false"):
        return []
    try:
        build = subprocess.run([binary, "-V"], capture_output=True, text=True, timeout=10).stderr
    except (OSError, subprocess.SubprocessError):
        return []
    directory = "/usr/lib/nginx/modules"
    for word in build.split():
        if word.startswith("--modules-path="):
            directory = word.partition("=")[2]
    # The Lua module needs the NDK loaded first (Debian builds it against it).
    modules = [os.path.join(directory, name) for name in ("ndk_http_module.so", "ngx_http_lua_module.so")]
    return modules if all(os.path.exists(m) for m in modules) else []


# Round robin over the endpoint list the demo last put, read from the shared dict when its
# version changes. One more try per balancing call, as ingress-nginx's balancer grants;
# proxy_next_upstream_tries caps the total. ingress-nginx's default balancer (round_robin)
# may hand a retry to the endpoint that just failed it (ingress-nginx issue #11852); its
# ``ewma`` balancer skips the endpoints already tried for the request. ``balance(true)``
# skips them too, until every endpoint has been tried.
BALANCER_LUA = """\
local ngx_balancer = require "ngx.balancer"
local shared = ngx.shared.endpoints
local M = {}
local seen, peers, turn = -1, {}, 0

local function refresh()
  local version = shared:get("version") or 0
  if version == seen then
    return
  end
  local fresh = {}
  for host, port in string.gmatch(shared:get("list") or "", "([%d%.]+):(%d+)") do
    fresh[#fresh + 1] = { host, tonumber(port), host .. ":" .. port }
  end
  seen, peers = version, fresh
end

function M.balance(skip_tried)
  refresh()
  local count = #peers
  if count == 0 then
    ngx.log(ngx.WARN, "no endpoints")
    return
  end
  local tried = ngx.ctx.tried
  if not tried then
    tried = {}
    ngx.ctx.tried = tried
  end
  turn = turn % count + 1
  local peer = peers[turn]
  if skip_tried then
    for _ = 2, count do
      if not tried[peer[3]] then
        break
      end
      turn = turn % count + 1
      peer = peers[turn]
    end
  end
  tried[peer[3]] = true
  ngx_balancer.set_more_tries(1)
  local ok, err = ngx_balancer.set_current_peer(peer[1], peer[2])
  if not ok then
    ngx.log(ngx.ERR, "set_current_peer: ", err)
  end
end

function M.put()
  ngx.req.read_body()
  shared:set("list", ngx.req.get_body_data() or "")
  ngx.say(shared:incr("version", 1, 0))
end

return M
"""


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
        self.modules = lua_modules(binary)
        self.control_path = os.path.join(directory, "control.sock")

    def config(self) -> str:
        d = self.directory
        # nginx refuses an upstream without servers; a server marked down stands in for none.
        servers = [f"        server 127.0.0.1:{port} max_fails=0;" for port in self._servers.values()]
        upstream = "\n".join(servers) or "        server 127.0.0.1:9 down;"
        modules = "".join(f"load_module {m};\n" for m in self.modules)
        control = ""
        if self.modules:
            # Loaded by the master at start-up, so the workers need no file of their own.
            skip = "true" if self.gateway_retry else "false"
            upstream = (
                "        server 0.0.0.1;  # a placeholder: the Lua balancer sets each try's peer\n"
                f'        balancer_by_lua_block {{ require("rollout_balancer").balance({skip}) }}'
            )
            control = f"""
    lua_shared_dict endpoints 1m;
    init_by_lua_block {{
        package.loaded.rollout_balancer = (function()
{BALANCER_LUA}
        end)()
    }}
    server {{
        listen unix:{self.control_path};
        location = /endpoints {{ content_by_lua_block {{ require("rollout_balancer").put() }} }}
    }}"""
        return f"""{modules}daemon off;
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
    scgi_temp_path {d}/scgi;{control}
    upstream pods {{
{upstream}
        keepalive 32;
    }}
    server {{
        listen 127.0.0.1:{self.port};
        client_max_body_size 8m;
{location(gateway_retry=self.gateway_retry)}
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
        if self.modules and self._servers:
            await self._put_endpoints()
        self.name = (
            f"nginx {_version(self.log_text())} (ingress-nginx upstream settings"
            + (", gateway retry" if self.gateway_retry else "")
            + (", Lua balancer)" if self.modules else ", endpoints by reload)")
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

    async def _put_endpoints(self) -> None:
        """Put the endpoint list to the Lua balancer; returns once nginx has stored it."""
        body = "".join(f"127.0.0.1:{port}\n" for port in self._servers.values()).encode()
        head = f"PUT /endpoints HTTP/1.0\r\nHost: control\r\nContent-Length: {len(body)}\r\n\r\n".encode()

        async def exchange() -> bytes:
            reader, writer = await asyncio.open_unix_connection(self.control_path)
            try:
                writer.write(head + body)
                return await reader.read()  # HTTP/1.0: nginx closes after the answer
            finally:
                writer.close()

        answer = await asyncio.wait_for(exchange(), timeout=10)
        if not answer.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200")):
            raise RuntimeError(f"nginx did not take the endpoint list: {answer[:200]!r}")

    async def _apply(self) -> None:
        if self.modules:
            await self._put_endpoints()
        else:
            await self._reload()

    async def add(self, endpoint: str, port: int) -> None:
        async with self._lock:
            self._servers[endpoint] = port
            await self._apply()

    async def remove(self, endpoint: str) -> None:
        async with self._lock:
            if self._servers.pop(endpoint, None) is not None:
                await self._apply()

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
