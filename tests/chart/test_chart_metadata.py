"""Chart.yaml as users and Artifact Hub see it: where it comes from, its icon, who maintains
it, the Kubernetes it supports, and the annotations Artifact Hub reads."""

from __future__ import annotations

import re
import tarfile
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from devtools.stack import ROOT
from tests.chart.conftest import CHART, KUBE_VERSION, helm, load_yaml, render_error

pytestmark = pytest.mark.chart

META = load_yaml(CHART / "Chart.yaml")
VALUES = load_yaml(CHART / "values.yaml")
# https://artifacthub.io/docs/topics/annotations/helm/
CHANGE_KINDS = {"added", "changed", "deprecated", "removed", "fixed", "security"}


def annotation(name: str) -> list[dict[str, str]]:
    parsed = yaml.safe_load(META["annotations"][name])
    assert isinstance(parsed, list) and parsed, name
    return parsed


def test_home_sources_and_maintainers_point_at_the_repository() -> None:
    home = urlparse(META["home"])
    assert home.scheme == "https" and home.path.count("/") == 2, META["home"]
    assert META["sources"] and all(s.startswith(META["home"]) for s in META["sources"])
    for maintainer in META["maintainers"]:
        assert maintainer["name"]
        # a way to reach them: an address or a page
        assert maintainer.get("email") or maintainer.get("url", "").startswith("https://")


def test_the_icon_is_the_committed_file_at_its_raw_url() -> None:
    icon = urlparse(META["icon"])
    owner_repo = urlparse(META["home"]).path.strip("/")
    m = re.fullmatch(rf"/{re.escape(owner_repo)}/main/(.+)", icon.path)
    assert icon.scheme == "https" and icon.netloc == "raw.githubusercontent.com" and m, icon
    committed = ROOT / m.group(1)
    assert committed.is_file() and committed.suffix in (".svg", ".png")
    text = committed.read_text()
    assert text.lstrip().startswith("<svg") and "viewBox" in text
    assert len(text) < 4096  # small: Artifact Hub and helm repo indexes fetch it


def test_kube_version_is_the_oldest_version_the_tests_render_for() -> None:
    assert META["kubeVersion"] == f">={KUBE_VERSION}-0"
    makefile = (ROOT / "Makefile").read_text()
    assert f"KUBE_VERSION     ?= {KUBE_VERSION}\n" in makefile
    assert (
        f"`kubeVersion: >={KUBE_VERSION.rsplit('.', 1)[0]}`"
        in (ROOT / "docs" / "kubernetes.md").read_text()
    )
    major, minor, _ = KUBE_VERSION.split(".")
    older = f"{major}.{int(minor) - 1}.15"
    urls = {"database.url": "postgresql://u:p@db/x", "broker.url": "redis://e:pw@r:6379/0"}
    error = render_error(sets=urls, kube_version=older)
    assert "incompatible with Kubernetes" in error


def test_artifact_hub_images_are_the_charts_image_at_app_version() -> None:
    images = annotation("artifacthub.io/images")
    assert [i["image"] for i in images] == [f"{VALUES['image']['repository']}:{META['appVersion']}"]
    assert all(i["name"] for i in images)


def test_artifact_hub_changes_and_links() -> None:
    changes = annotation("artifacthub.io/changes")
    assert {c["kind"] for c in changes} <= CHANGE_KINDS
    assert all(c["description"].strip() for c in changes)
    for link in annotation("artifacthub.io/links"):
        assert link["name"] and link["url"].startswith(META["home"] + "/")
        # a link into the repository names a file that is there
        path = link["url"].removeprefix(META["home"] + "/blob/main/")
        assert (ROOT / path).is_file(), link


def test_the_packaged_chart_carries_the_icon_not_the_readme_template(tmp_path: Path) -> None:
    helm("package", str(CHART), "--destination", str(tmp_path))
    (archive,) = tmp_path.glob("notes-exports-*.tgz")
    assert archive.name == f"notes-exports-{META['version']}.tgz"
    with tarfile.open(archive) as tar:
        names = {n.removeprefix("notes-exports/") for n in tar.getnames()}
    assert {"Chart.yaml", "README.md", "values.yaml", "values.schema.json", "icon.svg"} <= names
    assert "README.md.gotmpl" not in names
