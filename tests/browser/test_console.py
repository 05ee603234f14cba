"""The web console in a real browser (headless Chromium) against a real server (issue 34):
the page loads without a token, a read-only token signs in and sees the lineage of
`web/demo` (one node per checkpoint, the invalid one marked) and the storage chart, with no
action offered and markup in a tag shown as text; an admin token marks a checkpoint
invalid through the page and the API then says so. Any uncaught error or console error (a
CSP violation is one) fails the test. With CKPT_SCREENSHOTS=docs/console the tests also
write the screenshots docs/CONSOLE.md shows.
"""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
import trustme
from playwright.sync_api import Browser, Page, expect

from ..serverproc import ServerProcess, free_port
from .conftest import HIDDEN, INVALID_REASON, NS, SCRIPT_TAG, Demo, Watched, screenshot

# The first test to use the browser may install Chromium (apt-get update and install):
# more than the suite's 300 s per test on a slow mirror.
pytestmark = pytest.mark.timeout(1200)


def _get(demo: Demo, path: str, token: str | None) -> tuple[int, dict[str, str], bytes]:
    url = urlsplit(demo.server.url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=10)
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def sign_in(page: Page, demo: Demo, token: str) -> None:
    page.goto(demo.ui)
    page.fill("input[name=token]", token)
    page.click("form#signin button[type=submit]")
    expect(page.locator("[data-token-name]")).to_be_visible()


def open_namespace(page: Page) -> None:
    page.get_by_role("link", name=NS, exact=True).click()
    expect(page.locator("[data-checkpoint]")).to_have_count(12)


def test_page_and_assets_need_no_token_and_carry_a_strict_policy(demo: Demo) -> None:
    status, headers, body = _get(demo, "/ui/", None)
    assert status == 200
    assert headers["content-type"].startswith("text/html")
    csp = headers["content-security-policy"]
    for directive in ("default-src 'self'", "script-src 'self'", "frame-ancestors 'none'"):
        assert directive in csp
    assert "unsafe-inline" not in csp
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"] == "no-referrer"
    assert b'<script type="module" src="app.js">' in body  # no inline script
    status, headers, _ = _get(demo, "/ui/app.js", None)
    assert (status, headers["content-type"].split(";")[0]) == (200, "text/javascript")
    assert _get(demo, "/ui/../v1/stats", None)[0] in (401, 404)  # no way out of /ui/
    assert _get(demo, "/v1/whoami", None)[0] == 401  # the API still needs a token
    status, _, body = _get(demo, "/v1/whoami", demo.reader)
    assert (status, json.loads(body)) == (
        200,
        {"name": "viewer", "scopes": ["read:web/*"], "admin": False},
    )


@pytest.mark.slow
def test_read_only_token_sees_lineage_and_chart_but_no_action(demo: Demo, watched: Watched) -> None:
    page = watched.page
    sign_in(page, demo, demo.reader)
    assert page.evaluate("location.href").find("ckpt_") == -1  # the token is in no URL
    expect(page.locator("#namespaces")).to_contain_text(NS)
    expect(page.locator("#namespaces")).not_to_contain_text(HIDDEN)  # only what it may read
    expect(page.get_by_role("link", name="Operations")).to_have_count(0)
    screenshot(page, "namespaces")
    open_namespace(page)

    nodes = page.locator("[data-checkpoint]")
    assert sorted(nodes.evaluate_all("els => els.map(e => e.dataset.checkpoint)")) == sorted(
        demo.ids.values()
    )
    invalid = page.locator('[data-validity="invalid"]')
    expect(invalid).to_have_count(1)
    assert invalid.get_attribute("data-checkpoint") == demo.invalid
    expect(page.locator(f'[data-tombstone="{demo.deleted}"]')).to_have_count(1)
    expect(page.locator("svg.lineage path.edge.fork")).to_have_count(1)  # f1 leaves m5's line
    chart = page.locator('[data-chart="storage"]')
    expect(chart.locator("svg polyline")).not_to_have_count(0)

    # The tag holding markup is text, in the graph and in the details; nothing ran.
    page.locator(f'[data-checkpoint="{demo.ids["m8"]}"]').click()
    expect(page.locator("#detail .tag")).to_have_text(SCRIPT_TAG)
    expect(page.locator(f'[data-checkpoint="{demo.ids["m8"]}"] text.l2')).to_contain_text(
        SCRIPT_TAG
    )
    assert page.evaluate("window.__xss") is None
    expect(page.locator("#detail")).to_contain_text("longest delta chain")
    expect(page.locator("#detail [data-download]")).to_have_count(2)
    expect(page.locator("[data-action]")).to_have_count(0)  # read-only: nothing offered
    expect(page.locator("#retention")).to_contain_text("admin")
    screenshot(page, "lineage-read-only")
    assert watched.errors == []


def test_admin_marks_a_checkpoint_invalid_through_the_page(demo: Demo, watched: Watched) -> None:
    page = watched.page
    sign_in(page, demo, demo.admin)
    open_namespace(page)
    target = demo.ids["m9"]
    # The retention preview: the policy's plan, every live checkpoint in it, nothing applied.
    plan = page.locator("#retention-plan tbody tr")
    expect(plan).to_have_count(12)
    expect(page.locator('#retention-plan tr[data-plan="delete"]')).not_to_have_count(0)
    expect(page.locator("svg.lineage .would-delete")).not_to_have_count(0)

    page.locator(f'[data-checkpoint="{target}"]').click()
    expect(page.locator("#detail")).to_contain_text(target)
    page.fill("#detail input[name=reason]", "eval NaN")
    page.click('#detail [data-action="invalid"]')
    expect(page.locator(f'[data-checkpoint="{target}"]')).to_have_attribute(
        "data-validity", "invalid"
    )
    expect(page.locator("#detail")).to_contain_text("eval NaN")
    screenshot(page, "lineage-admin")

    status, _, body = _get(demo, f"/v1/namespaces/{NS}/checkpoints/{target}", demo.admin)
    validity = json.loads(body)["validity"]
    assert (status, validity["state"], validity["reason"]) == (200, "invalid", "eval NaN")
    status, _, body = _get(demo, f"/v1/namespaces/{NS}/checkpoints/{demo.invalid}", demo.admin)
    assert json.loads(body)["validity"]["reason"] == INVALID_REASON  # the other one untouched
    assert watched.errors == []


def test_admin_sees_operations(demo: Demo, watched: Watched) -> None:
    page = watched.page
    sign_in(page, demo, demo.admin)
    page.get_by_role("link", name="Operations").click()
    expect(page.locator("#tiers")).to_contain_text("hot")
    expect(page.locator("#audit")).to_contain_text("PATCH")  # the marks made so far
    screenshot(page, "operations")
    assert watched.errors == []


@pytest.mark.slow
def test_admin_tags_pins_and_deletes_after_confirming(demo: Demo, watched: Watched) -> None:
    page = watched.page
    sign_in(page, demo, demo.admin)
    expect(page.locator("#namespaces")).to_contain_text(HIDDEN)
    open_namespace(page)
    # The retention preview redraws the graph when it arrives: wait for it, as a user
    # would see it, so the click lands on the graph it leaves (a CI run clicked before).
    expect(page.locator("#retention-plan tbody tr")).not_to_have_count(0)
    target = demo.ids["f2"]
    node = page.locator(f'[data-checkpoint="{target}"]')
    node.click()
    expect(page.locator("#detail")).to_contain_text(target)
    page.fill("#detail input[name=tag]", "keep-me")
    page.click('#detail [data-action="tag"]')
    expect(node.locator("text.l2")).to_contain_text("#keep-me")
    page.click('#detail [data-action="pin"]')
    expect(page.locator('#detail [data-action="unpin"]')).to_be_visible()
    expect(page.locator('#detail [data-action="delete"]')).to_have_count(0)  # pinned: kept
    page.click('#detail [data-action="unpin"]')
    page.click('#detail [data-action="delete"]')
    assert _get(demo, f"/v1/namespaces/{NS}/checkpoints/{target}", demo.admin)[0] == 200
    page.click('#detail [data-action="confirm-delete"]')  # only now is it deleted
    expect(page.locator("[data-checkpoint]")).to_have_count(11)
    assert _get(demo, f"/v1/namespaces/{NS}/checkpoints/{target}", demo.admin)[0] == 404
    assert watched.errors == []


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("console-tls")
    ca = trustme.CA()
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(root / "s.pem"))
    (root / "s.pem").chmod(0o600)  # a key others may read is refused
    ca.cert_pem.write_to_path(str(root / "ca.pem"))
    probe = ssl.create_default_context(cafile=str(root / "ca.pem"))
    args = ("--tls-cert", str(root / "s.pem"), "--tls-key", str(root / "s.pem"))
    server = ServerProcess(root / "data", free_port(), root / "server.log", None, args, probe)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.mark.slow
def test_the_console_works_over_https(tls_server: ServerProcess, browser: Browser) -> None:
    """Same origin over TLS: the page, its modules and its API calls all come over https
    (a private CA the browser is told to accept), nothing from another host."""
    context = browser.new_context(ignore_https_errors=True)
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        urls: list[str] = []
        page.on("request", lambda r: urls.append(r.url))
        page.goto(f"{tls_server.url}/ui")  # the redirect to /ui/ too
        page.fill("input[name=token]", tls_server.token)
        page.click("form#signin button[type=submit]")
        expect(page.locator("[data-token-name]")).to_have_text("admin")
        expect(page.locator('[data-chart="storage"] svg')).to_have_count(1)
        assert errors == []
        assert urls
        assert all(u.startswith(tls_server.url + "/") for u in urls), urls
    finally:
        context.close()
