"""Metadata and tags on the real stack (gunicorn api, publisher, workers, scanner, beat):
exportctl submits and lists by them, and the console's jobs page filters by them in headless
Chromium with the filters kept in its URL, so that the view opens again from the URL alone
(docs/api.md "Metadata and tags", docs/console.md "What it shows")."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from playwright.sync_api import expect

from services.api.console.timeline import short
from tests.e2e import test_console_browser as browser_suite
from tests.e2e.conftest import E2E
from tests.e2e.test_cli_client import run
from tests.support import wait_for

pytestmark = pytest.mark.e2e

# Debian's chromium through Playwright, every request outside loopback refused: the console
# suite's own fixtures, used here under their names
playwright = browser_suite.playwright
browser = browser_suite.browser
guarded = browser_suite.guarded


@pytest.fixture(scope="module")
def backend() -> str:
    # the labels live in the database; the artifact backend plays no part
    return "file"


@pytest.fixture(scope="module")
def labelled(e2e: E2E, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Three exports through exportctl: two tagged ``nightly`` (one of them also ``team-a``
    with metadata), one without labels; all succeeded."""
    cwd = tmp_path_factory.mktemp("labels-cli")
    first, second, third = (str(n) for n in e2e.note_ids(3))
    jobs = {
        "both": run(
            e2e,
            cwd,
            "submit",
            "-n",
            first,
            "--tag",
            "nightly",
            "--tag",
            "team-a",
            "--meta",
            "order_id=ord=1234",
            "--meta",
            "team=a",
        ),
        "nightly": run(e2e, cwd, "submit", "-n", second, "--tag", "nightly"),
        "plain": run(e2e, cwd, "submit", "-n", third),
    }
    ids = {}
    for name, proc in jobs.items():
        assert proc.returncode == 0, proc.stderr
        ids[name] = proc.stdout.strip()
    for job in ids.values():
        wait_for(lambda job=job: e2e.db.job(job)["status"] == "succeeded", 60, "the exports")
    return ids


def test_exportctl_submits_shows_and_lists_by_labels(
    e2e: E2E, labelled: dict[str, str], tmp_path: Path
) -> None:
    status = run(e2e, tmp_path, "status", labelled["both"], "--json")
    assert status.returncode == 0, status.stderr
    shown = json.loads(status.stdout)
    # the value keeps its own "=": only the first one splits key from value
    assert shown["metadata"] == {"order_id": "ord=1234", "team": "a"}
    assert shown["tags"] == ["nightly", "team-a"]

    def listed(*args: str) -> list[str]:
        proc = run(e2e, tmp_path, "list", "--json", *args)
        assert proc.returncode == 0, proc.stderr
        return [r["id"] for r in json.loads(proc.stdout)]

    assert listed("--tag", "nightly") == [labelled["nightly"], labelled["both"]]
    assert listed("--tag", "nightly", "--tag", "team-a") == [labelled["both"]]
    assert listed("--meta", "order_id=ord=1234") == [labelled["both"]]
    assert listed("--tag", "nightly", "--meta", "team=b") == []
    table = run(e2e, tmp_path, "list", "--tag", "team-a")
    assert "#nightly #team-a order_id=ord=1234 team=a" in table.stdout, table.stdout
    assert labelled["plain"] not in table.stdout

    # a schedule's exports inherit its labels
    created = run(
        e2e,
        tmp_path,
        "schedule",
        "create",
        "--every",
        "3600",
        "-n",
        str(e2e.note_ids(1)[0]),
        "--tag",
        "sched",
        "--meta",
        "source=cli",
        "--output",
        "json",
    )
    assert created.returncode == 0, created.stderr
    schedule = json.loads(created.stdout)
    assert schedule["tags"] == ["sched"] and schedule["metadata"] == {"source": "cli"}
    ran = run(e2e, tmp_path, "schedule", "run", schedule["id"])
    assert ran.returncode == 0, ran.stderr
    assert listed("--tag", "sched", "--meta", "source=cli") == [ran.stdout.strip()]

    usage = run(e2e, tmp_path, "list", "--meta", "order_id")
    assert usage.returncode == 2 and "--meta takes KEY=VALUE" in usage.stderr
    refused = run(e2e, tmp_path, "submit", "--all", "--tag", "no spaces")
    assert refused.returncode == 1 and "a tag is 1-40 letters" in refused.stderr
    assert "Traceback" not in refused.stderr + usage.stderr


def test_the_console_filters_by_labels_and_the_url_reopens_the_view(
    e2e: E2E, labelled: dict[str, str], guarded
) -> None:
    page = guarded.context.new_page()
    browser_suite.sign_in(page, e2e)
    page.get_by_role("link", name="Jobs", exact=True).click()
    page.get_by_label("Tags").fill("nightly team-a")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"tags=nightly"))
    assert parse_qs(urlsplit(page.url).query)["tags"] == ["nightly team-a"]
    expect(page.get_by_role("link", name=short(labelled["both"]))).to_be_visible()
    expect(page.get_by_role("link", name=short(labelled["nightly"]))).to_have_count(0)
    expect(page.get_by_role("link", name=short(labelled["plain"]))).to_have_count(0)
    browser_suite.axe_check(page)

    # the URL alone is the view: another tab (a colleague's) opens the same filter, filled in
    shared = page.url
    other = guarded.context.new_page()
    other.goto(shared)
    expect(other.get_by_label("Tags")).to_have_value("nightly team-a")
    expect(other.get_by_role("link", name=short(labelled["both"]))).to_be_visible()
    expect(other.get_by_role("link", name=short(labelled["nightly"]))).to_have_count(0)

    # a metadata link of a row filters by that pair, kept in the URL with the rest
    other.get_by_role("link", name="order_id=ord=1234").click()
    expect(other).to_have_url(re.compile(r"meta=order_id%3Dord%3D1234"))
    expect(other.get_by_label("Metadata")).to_have_value("order_id=ord=1234")
    expect(other.get_by_role("link", name=short(labelled["both"]))).to_be_visible()

    # a malformed filter is said on the page, not ignored
    other.get_by_label("Metadata").fill("no pair here")
    other.get_by_role("button", name="Filter").click()
    expect(other.get_by_role("alert")).to_contain_text("metadata is one key=value pair")

    # the job page shows them, each a link to the jobs that share it
    page.get_by_role("link", name=short(labelled["both"])).click()
    expect(page.get_by_role("link", name="team-a", exact=True)).to_be_visible()
    page.get_by_role("link", name="nightly", exact=True).click()
    expect(page).to_have_url(re.compile(r"/console/jobs\?tags=nightly$"))
    expect(page.get_by_role("link", name=short(labelled["nightly"]))).to_be_visible()
    expect(page.get_by_role("link", name=short(labelled["both"]))).to_be_visible()
