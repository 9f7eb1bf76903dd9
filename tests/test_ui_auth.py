"""The operator UI's sign-in, at the HTTP level, against real redis-server and a real `reactq api`: the
session cookie's flags, the CSRF token of every form, a revoked key signed out, the operator key, the
security headers of every page."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable

import httpx
import pytest
import redis

from tests.fixtures_api import Api, make_key
from tests.fixtures_browser import form_token, operator_key, signed_in
from tests.fixtures_cluster import ROOT, Cluster
from worker.store import keys

pytestmark = pytest.mark.integration
UI = ROOT / "worker" / "api" / "ui"


def test_sign_in_sets_a_strict_httponly_expiring_cookie(tenancy_cluster: Cluster,
                                                       api_server: Callable[..., Api]) -> None:
    key = make_key(tenancy_cluster, "acme", plan="free")
    api = api_server()
    client = httpx.Client(base_url=api.url, timeout=30)
    api.clients.append(client)
    form = client.get("/ui")
    assert form.status_code == 200 and 'type="password"' in form.text
    answer = client.post("/ui/sign-in", data={"key": key, "csrf_token": form_token(form.text)})
    assert answer.status_code == 303
    [cookie] = [c for c in answer.headers.get_list("set-cookie") if c.startswith("reactq_ui=")]
    flags = {part.strip().split("=")[0].lower(): part.strip() for part in cookie.split(";")}
    assert "httponly" in flags and flags["samesite"].lower() == "samesite=strict"
    assert flags["path"] == "Path=/ui" and flags["max-age"] == "Max-Age=28800"
    token = cookie.split(";")[0].partition("=")[2]
    assert key not in cookie and len(token) >= 40  # a random token; the key stays with the person
    # the session is server-side, under the token's digest, and expires with the cookie
    r = redis.Redis.from_url(tenancy_cluster.env["REACTQ_REDIS_URL"])
    name = keys.ui_session(hashlib.sha256(token.encode()).hexdigest())
    assert r.hget(name, "tenant") == b"acme" and 0 < r.ttl(name) <= 28800
    assert key.encode() not in b"".join(r.hvals(name))
    r.close()
    assert "tenant acme" in client.get("/ui/runs").text


def test_a_wrong_key_or_no_sign_in_token_is_refused(tenancy_cluster: Cluster, api_server: Callable[..., Api]) -> None:
    make_key(tenancy_cluster, "acme", plan="free")
    api = api_server()
    client = api.client(None)
    form = client.get("/ui")
    wrong = client.post("/ui/sign-in", data={"key": "rq_0123456789abcdef_" + "x" * 43,
                                             "csrf_token": form_token(form.text)})
    assert wrong.status_code == 401 and "unknown API key" in wrong.text and "reactq_ui=" not in str(wrong.headers)
    no_token = httpx.post(f"{api.url}/ui/sign-in", data={"key": "anything"})
    assert no_token.status_code == 403 and "CSRF" in no_token.text


def test_pages_need_a_session(tenancy_cluster: Cluster, api_server: Callable[..., Api]) -> None:
    make_key(tenancy_cluster, "acme", plan="free")
    api = api_server()
    for path in ("/ui/runs", "/ui/runs/abc", "/ui/runs/abc/live"):
        answer = httpx.get(f"{api.url}{path}")
        assert answer.status_code == 303 and answer.headers["location"].startswith("/ui"), path
    forged = httpx.get(f"{api.url}/ui/runs", cookies={"reactq_ui": "forged-token-" + "x" * 40})
    assert forged.status_code == 303


def test_forms_need_the_csrf_token(tenancy_cluster: Cluster, api_server: Callable[..., Api]) -> None:
    key = make_key(tenancy_cluster, "acme", plan="free")
    api = api_server()
    client, token = signed_in(api, key)
    for data in ({}, {"csrf_token": "wrong"}):
        refused = client.post("/ui/sign-out", data=data)
        assert refused.status_code == 403 and "CSRF" in refused.text
        assert client.get("/ui/runs").status_code == 200  # still signed in
    out = client.post("/ui/sign-out", data={"csrf_token": token})
    assert out.status_code == 303
    assert client.get("/ui/runs").status_code == 303


def test_a_copied_cookie_is_useless_after_sign_out(tenancy_cluster: Cluster, api_server: Callable[..., Api]) -> None:
    key = make_key(tenancy_cluster, "acme", plan="free")
    api = api_server()
    client, token = signed_in(api, key)
    copied = dict(client.cookies)
    client.post("/ui/sign-out", data={"csrf_token": token})
    assert httpx.get(f"{api.url}/ui/runs", cookies=copied).status_code == 303


def test_a_revoked_key_is_signed_out(tenancy_cluster: Cluster, api_server: Callable[..., Api]) -> None:
    key = make_key(tenancy_cluster, "acme", plan="free")
    api = api_server()
    client, _ = signed_in(api, key)
    revoked = tenancy_cluster.reactq("key", "revoke", key.split("_")[1])
    assert revoked.returncode == 0, revoked.stderr
    answer = client.get("/ui/runs")
    assert answer.status_code == 303 and answer.headers["location"] == "/ui?signed_out=revoked"
    assert "revoked" in client.get(answer.headers["location"]).text


def test_the_operator_key_signs_in_to_the_ui_only(tenancy_cluster: Cluster, api_server: Callable[..., Api]) -> None:
    created = tenancy_cluster.reactq("key", "create", "--operator", "--json")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip().splitlines()[-1].split('"key": "')[1].split('"')[0]
    api = api_server()
    refused = api.client(key).get("/v1/runs")
    assert refused.status_code == 403 and "operator key" in refused.json()["error"]["message"]
    client, _ = signed_in(api, key)
    page = client.get("/ui/runs").text
    assert "operator" in page and 'name="tenant"' in page  # the tenant filter
    listed = tenancy_cluster.reactq("key", "list", "--operator")
    assert key.split("_")[1] in listed.stdout
    assert tenancy_cluster.reactq("key", "create").returncode != 0  # neither a tenant nor --operator


def test_every_ui_response_has_the_strict_headers(tenancy_cluster: Cluster, api_server: Callable[..., Api]) -> None:
    operator_key(tenancy_cluster)  # the API starts with an operator key as its only key
    api = api_server()
    for path in ("/ui", "/ui/static/ui.css", "/ui/static/htmx.min.js", "/ui/nowhere", "/ui/runs"):
        answer = httpx.get(f"{api.url}{path}")
        csp = answer.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "'unsafe-inline'" not in csp, path
        assert answer.headers["x-content-type-options"] == "nosniff" and answer.headers["x-frame-options"] == "DENY"
    assert httpx.get(f"{api.url}/ui/nowhere").status_code == 404
    assert httpx.get(f"{api.url}/ui/static/..%2Fsession.py").status_code == 404
    assert "content-security-policy" not in httpx.get(f"{api.url}/healthz").headers  # the JSON API is as it was


def test_no_inline_script_or_style_in_any_template() -> None:
    for path in (UI / "templates").glob("*.html"):
        text = path.read_text()
        assert not re.search(r"<script(?![^>]*\bsrc=)", text), f"{path.name}: an inline script"
        assert "<style" not in text and " style=" not in text and not re.search(r"\son[a-z]+=", text), path.name
        assert "|safe" not in text.replace(" ", "") and "autoescape false" not in text, path.name


def test_the_vendored_htmx_is_the_recorded_one() -> None:
    digest = hashlib.sha256((UI / "static" / "htmx.min.js").read_bytes()).hexdigest()
    assert digest in (UI / "VENDORED.md").read_text()


def test_the_cookie_is_secure_behind_a_tls_proxy(tenancy_cluster: Cluster, api_server: Callable[..., Api]) -> None:
    key = make_key(tenancy_cluster, "acme", plan="free")
    tenancy_cluster.env["REACTQ_UI_COOKIE_SECURE"] = "true"
    api = api_server()
    form = httpx.get(f"{api.url}/ui")
    assert "; Secure" in form.headers["set-cookie"]  # the sign-in form's token cookie too
    signin_cookie = form.headers["set-cookie"].split(";")[0]  # a client keeps Secure cookies for https only
    answer = httpx.post(f"{api.url}/ui/sign-in", data={"key": key, "csrf_token": form_token(form.text)},
                        headers={"Cookie": signin_cookie})
    [cookie] = [c for c in answer.headers.get_list("set-cookie") if c.startswith("reactq_ui=")]
    assert "; Secure" in cookie and "HttpOnly" in cookie


def test_insecure_no_auth_needs_no_sign_in_but_still_a_csrf_token(tenancy_cluster: Cluster,
                                                                 api_server: Callable[..., Api]) -> None:
    api = api_server("--insecure-no-auth")
    client = api.client(None)
    assert client.get("/ui").headers["location"] == "/ui/runs"
    runs = client.get("/ui/runs")
    assert runs.status_code == 200 and "tenant default" in runs.text and "Sign out" not in runs.text
    run_id = client.post("/v1/runs", json={"question": "What is 1 + 1?"}).json()["run_id"]  # queued: no worker
    assert client.post(f"/ui/runs/{run_id}/cancel", data={}).status_code == 403  # CSRF still checked
    token = form_token(client.get(f"/ui/runs/{run_id}").text)
    assert client.post(f"/ui/runs/{run_id}/cancel", data={"csrf_token": token}).status_code == 303
    assert tenancy_cluster.wait_for_run(run_id)["status"] == "cancelled"
