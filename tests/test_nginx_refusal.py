"""Behind nginx, a refused POST is an explicit 503, never a 502.

nginx configured as ingress-nginx configures its upstreams (HTTP/1.1, ``keepalive 32``,
``proxy_next_upstream error timeout``; the directives are nginx's own, see
http://nginx.org/en/docs/http/ngx_http_upstream_module.html#keepalive). graceful refuses in
refuse mode (``admit_during_propagation=False``, draining), for bodies up to 1 MB. If the
503 were sent before the body was read and the connection then closed, the kernel's reset
would reach nginx before the 503 and nginx would answer 502 (issue 13: 237 of 400 at 1 MB).

nginx listens on a Unix socket, so the test needs no free TCP port; graceful's uvicorn runs
on a socket bound to port 0. Skipped where nginx is not installed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.asgi.test_refusal_body import refusing_server

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install nginx)")

ATTEMPTS = 100
SIZES = (64 * 1024, 256 * 1024, 1_000_000)

CONFIG = """
daemon off;
master_process on;
worker_processes 1;
user root;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    upstream graceful {{
        server 127.0.0.1:{port} max_fails=0;
        keepalive 32;
    }}
    server {{
        listen unix:{dir}/nginx.sock;
        client_max_body_size 8m;
        location / {{
            proxy_pass http://graceful;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_next_upstream error timeout;
            proxy_next_upstream_tries 3;
        }}
    }}
}}
"""


@contextlib.contextmanager
def nginx_in_front(port: int, directory: Path) -> Iterator[str]:
    assert NGINX is not None
    config = directory / "nginx.conf"
    config.write_text(CONFIG.format(dir=directory, port=port))
    path = str(directory / "nginx.sock")
    log = directory / "stderr.log"
    with open(log, "wb") as stderr:
        process = subprocess.Popen(
            [NGINX, "-p", str(directory), "-c", str(config)], stdout=subprocess.DEVNULL, stderr=stderr
        )
    try:
        deadline = time.monotonic() + 10
        while True:
            assert process.poll() is None, log.read_text()
            with socket.socket(socket.AF_UNIX) as probe:
                if os.path.exists(path) and probe.connect_ex(path) == 0:
                    break
            assert time.monotonic() < deadline, "nginx did not start listening"
            time.sleep(0.02)
        yield path
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


@pytest.mark.parametrize("http", ["h11", "httptools"])
def test_refusals_through_nginx_are_503_never_502(http: str, tmp_path: Path) -> None:
    directory = Path(tmp_path)
    statuses: dict[int, Counter[str]] = {}
    with refusing_server(http, "draining") as port, nginx_in_front(port, directory) as path:
        transport = httpx.HTTPTransport(uds=path)
        with httpx.Client(transport=transport, base_url="http://nginx", timeout=20) as client:
            for size in SIZES:
                seen: Counter[str] = Counter()
                body = b"x" * size
                for _ in range(ATTEMPTS):
                    response = client.post("/v1/completions", content=body)
                    marked = response.headers.get("x-graceful-not-started") == "1"
                    seen[f"{response.status_code}{' not-started' if marked else ''}"] += 1
                statuses[size] = seen
    assert statuses == {size: Counter({"503 not-started": ATTEMPTS}) for size in SIZES}, statuses
