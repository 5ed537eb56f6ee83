"""The operator console in a real headless Chromium (Debian's ``chromium``, driven by
Playwright with that executable; no browser is ever downloaded) against the real stack:
gunicorn api, publisher, recovery-scanner, beat and both Celery workers.

An operator signs in, finds a failed job by filter, opens its timeline, replays it and
watches the replay succeed live; cancels a running export; pauses a schedule. A form
posted without its CSRF token is refused. Every page is checked with axe-core (WCAG 2 A/AA
rules), at 1280x800 and at a phone's width, and no page may make a request anywhere but
the api on loopback: every request of the browser goes through a route that records (and
aborts) any other destination, and each test ends by asserting there was none.

Screenshots of every page land in .test/screenshots/ (ignored; docs/images/ holds a few).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import Browser, BrowserContext, Page, Playwright, expect, sync_playwright

from devtools.stack import ROOT
from exportcore import faults
from tests.e2e.conftest import E2E, FAST_RECOVERY_ENV, moto_for, running_stack
from tests.support import wait_for

pytestmark = pytest.mark.e2e

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
# Flags that work as root on this machine type (no sandbox for root, no GPU, and none of
# Chromium's own background connections, which the closed network would refuse).
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHOTS = ROOT / ".test" / "screenshots"
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
WIDE = {"width": 1280, "height": 800}
NARROW = {"width": 390, "height": 844}
LIVE_TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def stack(
    request, servers, template_db, notes_dir, tmp_path_factory, backend
) -> Iterator[tuple[E2E, Path]]:
    base = tmp_path_factory.mktemp(f"console-{backend}")
    fault_file = base / "faults.json"
    env = {faults.ENV: str(fault_file), **FAST_RECOVERY_ENV, "CONSOLE_REFRESH_SECONDS": "1"}
    with running_stack(
        servers, template_db, notes_dir, base, env, backend=backend, s3=moto_for(request, backend)
    ) as e:
        yield e, fault_file


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make browser` installs Debian's chromium")
    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    # Playwright gives every launch a fresh, empty --user-data-dir of its own.
    b = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
    yield b
    b.close()


class Guarded:
    """A browser context whose every request is checked: loopback goes through, anything
    else is recorded in ``external`` and aborted."""

    def __init__(self, context: BrowserContext) -> None:
        self.context = context
        self.external: list[str] = []
        context.route("**/*", self._route)

    def _route(self, route: Any) -> None:
        url = route.request.url
        host = urlsplit(url).hostname or ""
        if url.startswith(("data:", "blob:", "about:")) or host in LOOPBACK:
            route.continue_()
        else:
            self.external.append(url)
            route.abort()


@pytest.fixture
def guarded(browser: Browser) -> Iterator[Guarded]:
    # The browser's zone is not UTC, so the test sees times converted (and UTC on hover).
    context = browser.new_context(viewport=WIDE, timezone_id="Europe/Berlin", locale="en-GB")
    g = Guarded(context)
    yield g
    context.close()
    assert g.external == [], f"the console made requests outside the api: {g.external}"


def shot(page: Page, backend: str, name: str) -> None:
    folder = SHOTS / backend
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / f"{name}.png"), full_page=False)


def sign_in(page: Page, e: E2E, key_text: str | None = None) -> None:
    """Sign in through the form, with the keyboard only (the stack's admin key, or
    ``key_text``)."""
    page.goto(f"{e.stack.api_url}/console/")
    expect(page).to_have_url(re.compile(r"/console/login\?next="))
    key = page.get_by_label("Operator key")
    expect(key).to_be_focused()  # autofocus
    page.keyboard.type(key_text or e.api.admin_key)
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(r"/console/$"))
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()


def axe_check(page: Page) -> None:
    """No WCAG 2 A/AA violation that axe-core rates serious or critical."""
    results = Axe().run(
        page, options={"runOnly": {"type": "tag", "values": ["wcag2a", "wcag2aa", "wcag21aa"]}}
    )
    bad = [
        f"{v['id']} ({v['impact']}): {[n['target'] for n in v['nodes']][:3]}"
        for v in results.response["violations"]
        if v["impact"] in ("serious", "critical")
    ]
    assert bad == [], bad


def test_find_a_failed_job_open_its_timeline_replay_it_and_watch_it_succeed(
    stack, guarded, backend
) -> None:
    e, fault_file = stack
    faults.arm(fault_file, "render.chunk", "permanent", times=1)
    failed_id = e.api.submit_ok({"note_ids": e.note_ids(3)})
    assert e.db.wait_terminal(failed_id, 30)["status"] == "failed"
    page = guarded.context.new_page()
    sign_in(page, e)
    shot(page, backend, "overview")

    page.get_by_role("link", name="Jobs", exact=True).click()
    page.get_by_label("State").select_option("failed")
    page.get_by_label("Error code").fill("injected_permanent")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"status=failed"))
    row_link = page.get_by_role("link", name=failed_id[:8])
    expect(row_link).to_be_visible()
    shot(page, backend, "jobs-failed")

    row_link.click()
    expect(page.get_by_text("Failed with injected_permanent after 1 attempt(s)")).to_be_visible()
    timeline = page.locator("ol.timeline")
    for step in ("Submitted", "Dispatched", "Claimed: attempt 1 of 3", "Dead-lettered"):
        expect(timeline.get_by_text(step, exact=False).first).to_be_visible()
    # times in the browser's zone, UTC on hover
    first_time = page.locator("time[data-local]").first
    assert first_time.get_attribute("title", timeout=5000).endswith("UTC")
    expect(first_time).not_to_contain_text("UTC")
    shot(page, backend, "job-failed")

    page.get_by_role("link", name="Replay…").click()
    expect(page.get_by_text("create a new job", exact=False)).to_be_visible()
    shot(page, backend, "replay-confirm")
    page.get_by_role("button", name="Replay now").click()
    expect(page.get_by_text("Replay accepted")).to_be_visible()
    replay_url = page.url
    replay_id = re.search(r"/console/jobs/([0-9a-f-]{36})", replay_url).group(1)  # type: ignore[union-attr]
    assert replay_id != failed_id
    page.wait_for_load_state("load")
    loads: list[str] = []
    page.on("load", lambda p: loads.append(p.url))
    # the page follows the job live (htmx polls its state): no reload, no click
    expect(page.locator("#job-live [data-status]").first).to_have_text(
        "succeeded", timeout=LIVE_TIMEOUT_MS
    )
    assert loads == [] and page.url == replay_url
    expect(page.get_by_text("Replay of")).to_be_visible()
    shot(page, backend, "job-replay-succeeded")
    assert e.db.job(replay_id)["status"] == "succeeded"

    page.goto(f"{e.stack.api_url}/console/jobs/{failed_id}")
    expect(page.get_by_text("It was replayed as job", exact=False)).to_be_visible()
    page.get_by_role("link", name="Dead letters", exact=True).click()
    expect(page.get_by_role("link", name="injected_permanent")).to_be_visible()
    shot(page, backend, "dead-letters")


def test_cancel_a_running_export(stack, guarded, backend) -> None:
    e, fault_file = stack
    # the export stalls in its first chunk for 20 s: long enough to be seen running on a
    # loaded machine; the worker then finds the cancel at its chunk boundary
    faults.arm(fault_file, "render.chunk", "sleep:20", times=1)
    job_id = e.api.submit_ok({"all": True})
    wait_for(
        lambda: (
            faults.remaining(fault_file, "render.chunk") == 0
            and e.db.job(job_id)["status"] == "running"
        ),
        120,  # a bulk worker that is still starting on a loaded machine picks it up late
        "the export running (stalled in a chunk)",
    )
    page = guarded.context.new_page()
    sign_in(page, e)
    page.goto(f"{e.stack.api_url}/console/jobs/{job_id}")
    expect(page.locator("#job-live [data-status]").first).to_have_text("running")
    page.get_by_role("link", name="Cancel…").click()
    expect(page.get_by_text("next chunk", exact=False)).to_be_visible()
    page.get_by_role("button", name="Cancel the job").click()
    expect(page.get_by_text("Cancel requested.", exact=False)).to_be_visible()
    expect(page.locator("#job-live [data-status]").first).to_have_text(
        "cancelled", timeout=LIVE_TIMEOUT_MS
    )
    expect(page.locator("ol.timeline").get_by_text("Cancel requested")).to_be_visible()
    row = e.db.job(job_id)
    assert row["status"] == "cancelled" and row["result_ref"] is None


def create_schedule(e: E2E, name: str) -> str:
    r = httpx.post(
        f"{e.stack.api_url}/v1/schedules",
        json={"name": name, "cron": "0 2 * * *", "timezone": "Europe/Berlin", "all": True},
        headers=e.api.auth,
        timeout=10,
    )
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def schedule_enabled(e: E2E, schedule_id: str) -> bool:
    return bool(e.db.scalar("SELECT enabled FROM export_schedules WHERE id = %s", (schedule_id,)))


def test_pause_a_schedule(stack, guarded, backend) -> None:
    e, _ = stack
    name = f"nightly-{backend}"
    schedule_id = create_schedule(e, name)
    page = guarded.context.new_page()
    sign_in(page, e)
    page.get_by_role("link", name="Schedules", exact=True).click()
    card = page.locator(f"#schedule-{schedule_id}")
    expect(card.get_by_text("active", exact=True)).to_be_visible()
    expect(card.get_by_role("button", name=f"Run schedule {name} now")).to_be_enabled()
    shot(page, backend, "schedules")
    card.get_by_role("button", name=f"Pause schedule {name}").click()
    expect(page.get_by_text("Schedule paused")).to_be_visible()
    card = page.locator(f"#schedule-{schedule_id}")
    expect(card.get_by_text("paused", exact=True)).to_be_visible()
    expect(card.get_by_role("button", name=f"Resume schedule {name}")).to_be_visible()
    assert schedule_enabled(e, schedule_id) is False
    # a paused schedule can still be run by hand: a manual slot, its export's page follows it
    card.get_by_role("button", name=f"Run schedule {name} now").click()
    expect(page.get_by_text("Schedule run now")).to_be_visible()
    assert "/console/jobs/" in page.url
    with e.db.connect() as conn:
        slot = conn.execute(
            "SELECT trigger, job_id FROM export_schedule_slots WHERE schedule_id = %s",
            (schedule_id,),
        ).fetchone()
    assert slot is not None and slot["trigger"] == "manual"
    assert str(slot["job_id"]) in page.url


def test_a_form_without_its_csrf_token_is_refused(stack, guarded, backend) -> None:
    e, _ = stack
    name = f"weekly-{backend}"
    schedule_id = create_schedule(e, name)
    page = guarded.context.new_page()
    sign_in(page, e)
    page.goto(f"{e.stack.api_url}/console/schedules?tenant={e.tenant}")
    pause = page.get_by_role("button", name=f"Pause schedule {name}")
    # a forged form: the same post, without the token
    page.evaluate("document.querySelectorAll('input[name=csrf_token]').forEach(i => i.remove())")
    pause.click()
    expect(page.get_by_role("heading", name="Request refused")).to_be_visible()
    expect(page.get_by_text("Nothing was changed", exact=False)).to_be_visible()
    assert schedule_enabled(e, schedule_id)
    # the session's cookie alone, as a page on another site would send it
    for form in ({}, {"csrf_token": "guess"}):
        forged = guarded.context.request.post(
            f"{e.stack.api_url}/console/schedules/{schedule_id}/pause", form=form
        )
        assert forged.status == 403
    assert schedule_enabled(e, schedule_id)
    page.goto(f"{e.stack.api_url}/console/schedules?tenant={e.tenant}")
    page.get_by_role("button", name=f"Pause schedule {name}").click()
    expect(page.get_by_text("Schedule paused")).to_be_visible()
    assert not schedule_enabled(e, schedule_id)


def test_every_page_is_accessible_works_narrow_and_loads_nothing_external(
    stack, guarded, backend
) -> None:
    e, _ = stack
    job_id = e.api.submit_ok({"note_ids": e.note_ids(2)})
    e.db.wait_terminal(job_id, 30)
    page = guarded.context.new_page()
    page.goto(f"{e.stack.api_url}/console/login")
    axe_check(page)
    shot(page, backend, "login")
    sign_in(page, e)
    pages = {
        "overview": "/console/",
        "jobs": "/console/jobs",
        "job": f"/console/jobs/{job_id}",
        "dead-letters": "/console/dead-letters",
        "schedules": "/console/schedules",
        "tenants": "/console/tenants",
        "webhooks": "/console/webhooks",
        "audit": "/console/audit",
        "workers": "/console/workers",
    }
    for name, path in pages.items():
        for size, viewport in (("wide", WIDE), ("narrow", NARROW)):
            page.set_viewport_size(viewport)
            response = page.goto(e.stack.api_url + path)
            assert response is not None and response.status == 200, (path, response)
            page.wait_for_load_state("networkidle")
            axe_check(page)
            overflow = page.evaluate(
                "document.documentElement.scrollWidth - document.documentElement.clientWidth"
            )
            assert overflow <= 1, f"{path} at {size}: the page scrolls sideways by {overflow}px"
            shot(page, backend, f"{name}-{size}")
    page.set_viewport_size(WIDE)
    # dark mode (prefers-color-scheme): the same contrast rules hold
    page.emulate_media(color_scheme="dark")
    for path in ("/console/", f"/console/jobs/{job_id}"):
        page.goto(e.stack.api_url + path)
        assert (
            page.evaluate("getComputedStyle(document.body).backgroundColor") != "rgb(255, 255, 255)"
        )
        axe_check(page)
    shot(page, backend, "job-dark")
    page.emulate_media(color_scheme="light")
    # keyboard: the first Tab reaches the skip link, which moves focus to the content
    page.goto(e.stack.api_url + "/console/jobs")
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Skip to content")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("main")).to_be_focused()
    page.keyboard.press("Tab")
    focused = page.evaluate("document.activeElement.id")
    assert focused == "f-status", focused  # the first filter
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline != "none"


def only_once(backend: str) -> None:
    """Scenarios that do not depend on the artifact store run on the folder backend only
    (one browser session each: CI's time)."""
    if backend != "file":
        pytest.skip("the same on every artifact backend: run once, on the folder")


def test_a_viewer_sees_no_action_and_its_forged_post_is_refused(stack, guarded, backend) -> None:
    only_once(backend)
    e, fault_file = stack
    faults.arm(fault_file, "render.chunk", "permanent", times=1)
    failed_id = e.api.submit_ok({"note_ids": e.note_ids(2)})
    assert e.db.wait_terminal(failed_id, 30)["status"] == "failed"
    from exportcore.auth import create_operator_key

    with e.db.connect() as conn:
        viewer_key, _ = create_operator_key(conn, label="vera", role="viewer")
    page = guarded.context.new_page()
    sign_in(page, e, viewer_key)
    page.goto(f"{e.stack.api_url}/console/jobs/{failed_id}")
    expect(page.get_by_text("Failed with injected_permanent", exact=False)).to_be_visible()
    expect(page.locator("header .role-viewer")).to_have_text("viewer")
    for name in ("Replay…", "Cancel…"):
        expect(page.get_by_role("link", name=name)).to_have_count(0)
    expect(page.get_by_role("button", name="Mark resolved")).to_have_count(0)
    shot(page, backend, "job-as-viewer")
    token = page.locator("input[name=csrf_token]").first.get_attribute("value")
    forged = guarded.context.request.post(
        f"{e.stack.api_url}/console/jobs/{failed_id}/replay", form={"csrf_token": token or ""}
    )
    assert forged.status == 403 and "viewer" in forged.text()
    assert e.db.scalar("SELECT count(*) FROM export_jobs WHERE replay_of = %s", (failed_id,)) == 0


def test_a_bulk_replay_shows_its_count_asks_runs_and_lands_on_the_audit_page(
    stack, guarded, backend
) -> None:
    only_once(backend)
    e, fault_file = stack
    faults.arm(fault_file, "render.chunk", "permanent", times=3)
    ids = [e.api.submit_ok({"note_ids": e.note_ids(2)}) for _ in range(3)]
    for job_id in ids:
        assert e.db.wait_terminal(job_id, 60)["status"] == "failed"
    open_now = e.db.scalar(
        "SELECT count(*) FROM export_dead_letters WHERE state = 'open' "
        "AND reason = 'injected_permanent'"
    )
    assert open_now >= 3
    page = guarded.context.new_page()
    sign_in(page, e)
    page.goto(f"{e.stack.api_url}/console/jobs?status=failed&error_code=injected_permanent")
    page.get_by_role("link", name="Replay every matching failed job…").click()
    expect(page.locator("#bulk-count")).to_contain_text(f"{open_now} job(s) match")
    shot(page, backend, "bulk-confirm")
    page.get_by_role("button", name=f"Replay {open_now} job(s)").click()
    expect(page).to_have_url(re.compile(r"/console/audit/\d+\?done=bulk_started"))
    expect(page.get_by_role("heading", name=re.compile("Bulk replay: done"))).to_be_visible(
        timeout=LIVE_TIMEOUT_MS
    )
    expect(page.locator("#bulk-progress")).to_contain_text(f"{open_now} of {open_now} reached")
    expect(page.locator("#audit-count")).to_have_text(str(open_now))
    shot(page, backend, "bulk-audit")
    for job_id in ids:
        assert e.db.scalar("SELECT count(*) FROM export_jobs WHERE replay_of = %s", (job_id,)) == 1


def test_a_viewer_sees_the_workers_with_their_queues_and_no_action(stack, guarded, backend) -> None:
    only_once(backend)
    e, _ = stack
    from exportcore.auth import create_operator_key

    with e.db.connect() as conn:
        viewer_key, _ = create_operator_key(conn, label="wanda", role="viewer")
    page = guarded.context.new_page()
    sign_in(page, e, viewer_key)
    page.get_by_role("link", name="Workers").click()
    expect(page.get_by_role("heading", name="Workers")).to_be_visible()
    expect(page.get_by_role("link", name="Workers")).to_have_attribute("aria-current", "page")
    # the stack's two workers, each answering with the queue it consumes
    for node, queue in (("fast@", "exports.fast"), ("bulk@", "exports.bulk")):
        row = page.locator("tbody tr").filter(has_text=node)
        expect(row).to_have_count(1)
        expect(row.locator("td").nth(1)).to_have_text(queue)
    expect(page.get_by_role("alert")).to_have_count(0)  # the broker answered
    expect(page.locator("main form, main button")).to_have_count(0)  # nothing to act on
    axe_check(page)
    shot(page, backend, "workers-as-viewer")


def test_pause_dispatch_of_a_tenant_see_its_export_wait_and_resume_it(
    stack, guarded, backend
) -> None:
    """The overview's Dispatch control: pause exports.fast for the tenant with a reason, see
    its export wait in the outbox (while its bulk export, submitted after it, runs), the
    pause in the recovery-scanner's gauges, then resume it from its row and watch the
    export succeed. Both changes are audited with the reason."""
    only_once(backend)
    e, _ = stack
    page = guarded.context.new_page()
    sign_in(page, e)
    dispatch = page.locator("#dispatch")
    expect(dispatch.get_by_text("nothing is paused")).to_be_visible()
    dispatch.get_by_label("Queue").select_option("exports.fast")
    dispatch.get_by_label("Tenant (empty: every tenant)").fill(e.tenant)
    dispatch.get_by_label("Reason", exact=True).fill("storage incident drill")
    dispatch.get_by_role("button", name="Pause dispatch").click()
    expect(page.get_by_text("Dispatch paused")).to_be_visible()
    row = page.locator("#dispatch tbody tr")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("storage incident drill")
    expect(page.locator("#overview-live").get_by_text("1 tenant paused")).to_be_visible()
    axe_check(page)
    shot(page, backend, "overview-dispatch-paused")

    waiting = e.api.submit_ok({"note_ids": e.note_ids(1)})
    flowing = e.api.submit_ok({"all": True})  # exports.bulk: not paused
    assert e.db.wait_terminal(flowing, 120)["status"] == "succeeded"
    # the pass that sent the bulk export came after the fast submit and left it alone
    assert e.db.scalar("SELECT status FROM export_jobs WHERE id = %s", (waiting,)) == "queued"
    assert (
        e.db.scalar(
            "SELECT count(*) FROM export_outbox WHERE job_id = %s AND sent_at IS NULL "
            "AND claim_token IS NULL AND publish_attempts = 0",
            (waiting,),
        )
        == 1
    )
    gauge = f'exports_dispatch_paused{{queue="exports.fast",tenant="{e.tenant}"}} 1.0'
    wait_for(
        lambda: gauge in httpx.get(e.stack.metrics_url("recovery-scanner"), timeout=10).text,
        30,
        "the recovery-scanner's gauge of the pause",
    )
    page.reload()
    expect(row).to_contain_text("1")  # the export waiting behind it

    row.get_by_label(f"Reason to resume exports.fast for {e.tenant}").fill("storage is back")
    row.get_by_role("button", name=f"Resume dispatch of exports.fast for {e.tenant}").click()
    expect(page.get_by_text("Dispatch resumed")).to_be_visible()
    expect(page.locator("#dispatch").get_by_text("nothing is paused")).to_be_visible()
    assert e.db.wait_terminal(waiting, 60)["status"] == "succeeded"
    with e.db.connect() as conn:
        audit = conn.execute(
            "SELECT action, target_id, detail->>'reason' AS reason FROM operator_actions "
            "WHERE target_kind = 'queue' ORDER BY id"
        ).fetchall()
    assert [(a["action"], a["reason"]) for a in audit] == [
        ("queue_pause", "storage incident drill"),
        ("queue_resume", "storage is back"),
    ]
    assert {a["target_id"] for a in audit} == {f"exports.fast/{e.tenant}"}
