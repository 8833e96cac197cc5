"""The dashboard's environments (ui/envs.js) in a real headless browser:
two real servers, each its own environment of one catalog, each its own
origin. The header shows the identity of the server the page is on; the
switcher navigates the tab to the other's dashboard, keeping the hash; each
origin keeps its own token in this tab's sessionStorage."""

from __future__ import annotations

import socket
from pathlib import Path

from dashkit import WAIT_MS, api, sign_in
from serverkit import ADMIN, AUTH, METRICS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _catalog(directory: Path, ports: dict[str, tuple[int, int]]) -> None:
    """One catalog for both servers: alpha and beta with their real URLs, and one without http."""
    (directory / "envs.toml").write_text("".join(
        f'[environments.{env}]\nregion = "{region}"\nhttp = "http://127.0.0.1:{ports[env][1]}"\n'
        f'grpc = "127.0.0.1:{ports[env][0]}"\ndescription = "test {env}"\n'
        for env, region in (("alpha", "eu-west-1"), ("beta", "us-east-2"))) +
        '[environments.cli-only]\ngrpc = "127.0.0.1:1"\n')


def _config(name: str, ports: dict[str, tuple[int, int]]) -> str:
    """The server of environment ``name``; its catalog is envs.toml next to its configuration file."""
    grpc, http = ports[name]
    return f"""
[server]
grpc_addr = "127.0.0.1:{grpc}"
http_addr = "127.0.0.1:{http}"
shutdown_grace_s = 2
environment = "{name}"
{AUTH}
[environments]
path = "envs.toml"
"""


def test_the_switcher_moves_between_environments_keeping_each_ones_token(browser, servers, tmp_path, shots):
    ports = {name: (_free_port(), _free_port()) for name in ("alpha", "beta")}
    _catalog(tmp_path, ports)   # (the servers' configuration files go in tmp_path too)
    alpha = servers(_config("alpha", ports), name="alpha")
    beta = servers(_config("beta", ports), name="beta")
    assert (alpha.http_port, beta.http_port) == (ports["alpha"][1], ports["beta"][1])
    with api(beta, METRICS) as http:
        assert http.get("/v1/snapshot").json()["environment"] == "beta"

    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    a_url = f"http://127.0.0.1:{alpha.http_port}"
    b_url = f"http://127.0.0.1:{beta.http_port}"
    page.goto(f"{a_url}/ui/#workers")
    # Signed out: neither the identity nor the switcher shows.
    assert page.locator("#env-switch").is_hidden()
    sign_in(page, ADMIN)
    identity = page.locator("#env-identity")
    page.wait_for_selector('#env-identity[data-environment="alpha"]', timeout=WAIT_MS)
    assert identity.inner_text() == "alpha · eu-west-1"
    switch = page.locator("#env-switch")
    switch.wait_for(timeout=WAIT_MS)
    options = switch.locator("option")
    assert [options.nth(i).get_attribute("value") for i in range(options.count())] == ["alpha", "beta", "cli-only"]
    assert switch.input_value() == "alpha"
    assert options.nth(2).is_disabled() and "(no HTTP URL)" in options.nth(2).inner_text()
    assert "(this server)" in options.nth(0).inner_text()
    shots(page, "environments")

    # Switching navigates the tab to beta's dashboard, at the same page (hash); beta asks for its own token.
    page.evaluate("window.notNavigated = true")
    switch.select_option("beta")
    page.wait_for_url(f"{b_url}/ui/#workers", timeout=WAIT_MS)
    page.wait_for_selector("#login:not([hidden])", timeout=WAIT_MS)
    assert page.evaluate("window.notNavigated") is None
    assert page.evaluate("sessionStorage.getItem('cronoq.token')") is None   # (alpha's token is not beta's)
    sign_in(page, METRICS)
    page.wait_for_selector('#env-identity[data-environment="beta"]', timeout=WAIT_MS)
    assert identity.inner_text() == "beta · us-east-2"
    assert not page.locator("#workers").is_hidden()
    assert page.locator("#env-switch").input_value() == "beta"
    assert page.evaluate("sessionStorage.getItem('cronoq.token')") == METRICS

    # Back to alpha, on another page: still signed in (alpha's token kept in alpha's sessionStorage of this tab).
    page.evaluate("location.hash = '#recurring'")
    page.wait_for_selector("#recurring:not([hidden])", timeout=WAIT_MS)
    page.locator("#env-switch").select_option("alpha")
    page.wait_for_url(f"{a_url}/ui/#recurring", timeout=WAIT_MS)
    page.wait_for_selector('#conn[data-state="live"]', timeout=WAIT_MS)
    page.wait_for_selector('#env-identity[data-environment="alpha"]', timeout=WAIT_MS)
    assert page.locator("#login").is_hidden() and not page.locator("#recurring").is_hidden()
    assert page.evaluate("sessionStorage.getItem('cronoq.token')") == ADMIN
    assert page.locator("#who").inner_text() == "role admin"
    assert context.cookies() == []
    context.close()
