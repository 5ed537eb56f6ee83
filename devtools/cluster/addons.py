"""The platform around the pods, built from the Go module proxy: a Gateway API controller
(Traefik), KEDA (operator and metrics API server), a trace store (Jaeger all-in-one),
prometheus-operator with its config reloader, and a Prometheus 3 server.

Each is a :class:`GoTool`: ``go mod download -json MODULE@VERSION`` (the module's source
zip, as published), a writable copy of that folder (the module cache is read-only, and two
of them need an edit before they build, see ``fixups``), then ``go build`` of its commands
into ``<CLUSTER_TOOLS>/bin/<name>/``. A stamp per tool (the recipe's digest) skips a tool
that is current; Go's caches make a rebuild after a recipe change mostly linking. The
recipes and cold times were checked by hand first (shared machine notes, "The platform
around the pods").

``build_addons`` runs inside ``python -m devtools.cluster build`` (the background prebuild of
``.ci/run``), after Kubernetes, one Go build at a time.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from devtools.cluster import config as c
from devtools.cluster.build import Say, Stamp, digest, go_env, output, run


def _traefik_fixup(src: Path) -> None:
    """The dashboard's assets are built by npm and are not in the module: an empty page
    stands in (the dashboard is off; only the embed directive needs a file)."""
    static = src / "webui" / "static"
    static.mkdir(parents=True, exist_ok=True)
    (static / "index.html").touch()


def _prometheus_operator_fixup(src: Path) -> None:
    """Its go.mod replaces two of its own published modules with folders the module zip
    lacks: require the published versions instead."""
    base = "github.com/prometheus-operator/prometheus-operator"
    version = c.PROMETHEUS_OPERATOR_VERSION
    run(
        [
            "go", "mod", "edit",
            f"-dropreplace={base}/pkg/client", f"-dropreplace={base}/pkg/apis/monitoring",
            f"-require={base}/pkg/client@{version}",
            f"-require={base}/pkg/apis/monitoring@{version}",
        ],
        cwd=src,
        env=go_env(),
    )  # fmt: skip


@dataclass(frozen=True)
class GoTool:
    """One program of the platform built from its module (see the module docstring)."""

    name: str
    module: str
    version: str
    packages: tuple[str, ...]
    ldflags: tuple[str, ...] = ()
    fixup: Callable[[Path], None] | None = None
    # "-mod=mod" where the fixup changed go.mod (go.sum gains the new requirements)
    build_flags: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    revision: int = 1

    @property
    def bin_dir(self) -> Path:
        """Folder of this tool's binaries."""
        return c.BIN / self.name

    @property
    def binaries(self) -> tuple[Path, ...]:
        """The built programs, named after their package folders."""
        return tuple(self.bin_dir / p.rstrip("/").rsplit("/", 1)[-1] for p in self.packages)

    def recipe(self) -> str:
        """What the stamp covers: everything that changes the output."""
        fix = self.fixup.__name__ if self.fixup else ""
        return json.dumps(
            [self.module, self.version, self.packages, self.ldflags, fix, self.build_flags,
             sorted(self.env.items())]
        )  # fmt: skip

    def stamp(self) -> Stamp:
        """The stamp of this recipe (``revision``: raise it when a fixup changes)."""
        return Stamp(self.bin_dir / ".stamp", digest([], self.recipe(), str(self.revision)))

    def current(self) -> bool:
        """True when every binary exists and was built from this recipe."""
        return self.stamp().fresh and all(b.is_file() for b in self.binaries)

    def build(self, say: Say) -> float:
        """Download, copy, fix up and build; returns the seconds spent (0 when current)."""
        if self.current():
            return 0.0
        t0 = time.monotonic()
        env = {**go_env(), **self.env}
        info = json.loads(
            output(["go", "mod", "download", "-json", f"{self.module}@{self.version}"], env=env)
        )
        if info.get("Error"):
            raise RuntimeError(f"go mod download {self.module}@{self.version}: {info['Error']}")
        src = c.TOOLS / "src" / f"{self.name}-{self.version}"
        shutil.rmtree(src, ignore_errors=True)
        src.parent.mkdir(parents=True, exist_ok=True)
        # The module cache is read-only: a copy without its modes can be edited.
        run(["cp", "-r", "--no-preserve=mode", info["Dir"], src])
        if self.fixup is not None:
            self.fixup(src)
        self.bin_dir.mkdir(parents=True, exist_ok=True)
        ldflags = " ".join(("-s", "-w", *self.ldflags))
        say(f"building {self.name} {self.version} ({', '.join(self.packages)})")
        try:
            run(
                ["nice", "go", "build", *self.build_flags, "-ldflags", ldflags,
                 "-o", f"{self.bin_dir}/", *self.packages],
                cwd=src,
                env=env,
            )  # fmt: skip
        finally:
            shutil.rmtree(src, ignore_errors=True)
        self.stamp().write()
        return time.monotonic() - t0


_PROM_VERSION = "github.com/prometheus/common/version"
ADDONS = (
    GoTool(
        "jaeger",
        "github.com/jaegertracing/jaeger",
        c.JAEGER_VERSION,
        ("./cmd/all-in-one",),
    ),
    GoTool(
        "prometheus-operator",
        "github.com/prometheus-operator/prometheus-operator",
        c.PROMETHEUS_OPERATOR_VERSION,
        ("./cmd/operator", "./cmd/prometheus-config-reloader"),
        ldflags=(f"-X {_PROM_VERSION}.Version={c.PROMETHEUS_OPERATOR_VERSION.lstrip('v')}",),
        fixup=_prometheus_operator_fixup,
        build_flags=("-mod=mod",),
    ),
    GoTool(
        "prometheus",
        "github.com/prometheus/prometheus",
        c.PROMETHEUS_MODULE_VERSION,
        ("./cmd/prometheus",),
        ldflags=(f"-X {_PROM_VERSION}.Version={c.PROMETHEUS_VERSION.lstrip('v')}",),
        # the module's go.work names folders its zip lacks
        env={"GOWORK": "off"},
    ),
    GoTool(
        "keda",
        "github.com/kedacore/keda/v2",
        c.KEDA_VERSION,
        ("./cmd/operator", "./cmd/adapter"),
        ldflags=(f"-X github.com/kedacore/keda/v2/version.Version={c.KEDA_VERSION.lstrip('v')}",),
    ),
    GoTool(
        "traefik",
        "github.com/traefik/traefik/v3",
        c.TRAEFIK_VERSION,
        ("./cmd/traefik",),
        ldflags=(f"-X github.com/traefik/traefik/v3/pkg/version.Version={c.TRAEFIK_VERSION}",),
        fixup=_traefik_fixup,
    ),
)


def addon(name: str) -> GoTool:
    """The tool called ``name``."""
    return next(t for t in ADDONS if t.name == name)


def build_addons(say: Say = print) -> dict[str, float]:
    """Build every platform tool that is not current, one after the other (one Go build at
    a time: the machine has two cores); returns the seconds spent on each one built and
    writes them to ``bin/.addon-times.json`` (the cold / warm table of docs/kubernetes.md).
    Builds nothing with ``CLUSTER_PLATFORM=0`` (``config.platform_enabled``)."""
    spent: dict[str, float] = {}
    if not c.platform_enabled():
        say("platform binaries not built (CLUSTER_PLATFORM=0)")
        return spent
    for tool in ADDONS:
        seconds = tool.build(say)
        if seconds:
            spent[tool.name] = round(seconds, 1)
            say(f"{tool.name} {tool.version}: {seconds:.0f} s")
    if spent:
        times = c.BIN / ".addon-times.json"
        old = json.loads(times.read_text()) if times.is_file() else {}
        times.write_text(json.dumps({**old, **spent}, indent=1) + "\n")
    return spent


def version_of(tool: GoTool) -> str:
    """The first line the tool's first binary prints for ``--version`` (a smoke check)."""
    proc = subprocess.run(
        [str(tool.binaries[0]), "--version"], capture_output=True, text=True, timeout=30
    )
    return (proc.stdout or proc.stderr).strip().splitlines()[0] if proc.returncode == 0 else ""


@dataclass(frozen=True)
class AddonImage:
    """An image made of some of the platform's binaries (static: nothing else inside)."""

    name: str
    files: dict[str, Path]
    entrypoint: str
    user: str = "65532:65532"

    def config(self) -> list[str]:
        """``buildah config`` arguments."""
        return ["--entrypoint", json.dumps([self.entrypoint]), "--user", self.user]


def addon_images() -> list[AddonImage]:
    """The images of the platform, named as config.py says; their entrypoints are where
    the upstream images have them (prometheus-operator names /bin/prometheus-config-reloader
    in the pods it creates, and Prometheus runs with the image's entrypoint)."""
    keda, po = addon("keda"), addon("prometheus-operator")
    return [
        AddonImage(c.TRAEFIK_IMAGE, {"/traefik": addon("traefik").binaries[0]}, "/traefik"),
        AddonImage(
            c.KEDA_IMAGE, {"/keda": keda.binaries[0], "/keda-adapter": keda.binaries[1]}, "/keda"
        ),
        AddonImage(c.JAEGER_IMAGE, {"/all-in-one": addon("jaeger").binaries[0]}, "/all-in-one"),
        AddonImage(c.PROMETHEUS_OPERATOR_IMAGE, {"/bin/operator": po.binaries[0]}, "/bin/operator"),
        AddonImage(
            c.CONFIG_RELOADER_IMAGE,
            {"/bin/prometheus-config-reloader": po.binaries[1]},
            "/bin/prometheus-config-reloader",
        ),
        AddonImage(
            c.PROMETHEUS_IMAGE,
            {"/bin/prometheus": addon("prometheus").binaries[0]},
            "/bin/prometheus",
            user="65534:65534",
        ),
    ]
