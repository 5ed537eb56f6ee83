"""Building what the cluster runs, from what the registries serve, cached between runs.

- Binaries (``build_binaries``): kube-apiserver, kube-controller-manager, kube-scheduler,
  kubelet, kube-proxy, crictl and the pause program from ``go/kube`` (Kubernetes from the Go
  module proxy, see its go.mod), CoreDNS from ``go/coredns``; into ``.tools/cluster/bin``.
  A stamp of the inputs skips the build when nothing changed; Go's own caches (GOMODCACHE,
  GOCACHE under $HOME) make a rebuild in a fresh clone a matter of linking.
- Images (``build_images``): a Python base made with debootstrap (Debian packages only), the
  pause and CoreDNS images from the binaries, PostgreSQL and Redis from Debian packages, the
  moto S3 server from PyPI, and the project's own Dockerfile built with ``PYTHON_IMAGE`` set
  to the base. buildah keeps its storage (and layer cache) under ``.tools/cluster/buildah``;
  each image is also saved as a docker-archive that ``cluster-up`` imports into containerd.

Every image is named ``localhost/...``: the cluster never pulls from a registry.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from devtools.cluster import config as c
from devtools.stack import ROOT

Say = Callable[[str], None]

KUBE_COMMANDS = (
    "k8s.io/kubernetes/cmd/kube-apiserver",
    "k8s.io/kubernetes/cmd/kube-controller-manager",
    "k8s.io/kubernetes/cmd/kube-scheduler",
    "k8s.io/kubernetes/cmd/kubelet",
    "k8s.io/kubernetes/cmd/kube-proxy",
    "sigs.k8s.io/cri-tools/cmd/crictl",
    "./pause",
)
BINARIES = (
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kube-proxy",
    "crictl",
    "pause",
    "coredns",
)


def run(cmd: Sequence[str | Path], *, say: Say | None = None, **kw: object) -> None:
    """Run a command, raising with its output's tail when it fails."""
    if say is not None:
        say("$ " + " ".join(str(x) for x in cmd))
    proc = subprocess.run([str(x) for x in cmd], capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-4000:]
        raise RuntimeError(f"{' '.join(str(x) for x in cmd)} exited {proc.returncode}:\n{tail}")


def output(cmd: Sequence[str | Path], **kw: object) -> str:
    """stdout of a command (raises on failure)."""
    proc = subprocess.run([str(x) for x in cmd], capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(str(x) for x in cmd)} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
        )
    return str(proc.stdout)


def digest(paths: Iterable[Path], *extra: str) -> str:
    """sha256 over the contents of ``paths`` (files, or every file below a folder) and ``extra``."""
    h = hashlib.sha256()
    for p in sorted(paths):
        files = (
            sorted(
                f
                for f in p.rglob("*")
                if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc"
            )
            if p.is_dir()
            else [p]
        )
        for f in files:
            h.update(str(f.relative_to(ROOT) if f.is_relative_to(ROOT) else f.name).encode())
            h.update(f.read_bytes())
    for e in extra:
        h.update(e.encode())
    return h.hexdigest()


class Stamp:
    """A file holding the digest of the inputs a cached output was built from."""

    def __init__(self, path: Path, value: str) -> None:
        self.path, self.value = path, value

    @property
    def fresh(self) -> bool:
        """True when the output was built from exactly these inputs."""
        return self.path.is_file() and self.path.read_text().strip() == self.value

    def write(self) -> None:
        """Record the inputs after a successful build."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(self.value + "\n")


# --- binaries --------------------------------------------------------------------------------


def _ldflags() -> str:
    major, minor = c.KUBE_VERSION.lstrip("v").split(".")[:2]
    return " ".join(
        [
            "-s -w",
            f"-X k8s.io/component-base/version.gitVersion={c.KUBE_VERSION}",
            f"-X k8s.io/component-base/version.gitMajor={major}",
            f"-X k8s.io/component-base/version.gitMinor={minor}",
            "-X k8s.io/component-base/version.gitTreeState=clean",
            f"-X sigs.k8s.io/cri-tools/pkg/version.Version={c.CRI_TOOLS_VERSION}",
        ]
    )


def go_env() -> dict[str, str]:
    """Environment of the Go builds: static binaries, Go's default caches (kept between CI
    runs on one machine), no VCS stamping (the module is inside this repository)."""
    env = dict(os.environ)
    env.update(CGO_ENABLED="0", GOFLAGS="-buildvcs=false -trimpath", GOTOOLCHAIN="local")
    return env


def build_binaries(say: Say = print) -> float:
    """Build the cluster's binaries into ``.tools/cluster/bin`` unless the stamp says they
    are current; returns the seconds spent."""
    if shutil.which("go") is None:
        raise RuntimeError("the cluster's binaries are built with Go: install Go 1.25 or newer")
    stamp = Stamp(c.BIN / ".stamp", digest([c.GO_DIR], _ldflags()))
    if stamp.fresh and all((c.BIN / b).is_file() for b in BINARIES):
        return 0.0
    t0 = time.monotonic()
    c.BIN.mkdir(parents=True, exist_ok=True)
    say(f"building Kubernetes {c.KUBE_VERSION}, crictl and pause (minutes when Go's cache is cold)")
    run(
        ["nice", "go", "build", "-o", f"{c.BIN}/", "-ldflags", _ldflags(), *KUBE_COMMANDS],
        cwd=c.GO_DIR / "kube",
        env=go_env(),
    )
    say(f"building CoreDNS {c.COREDNS_VERSION}")
    run(
        ["nice", "go", "build", "-o", c.BIN / "coredns", "-ldflags", "-s -w", "."],
        cwd=c.GO_DIR / "coredns",
        env=go_env(),
    )
    stamp.write()
    return time.monotonic() - t0


def crds_dir(module: str, version: str, sub: str) -> Path:
    """A folder of a Go module's zip (downloaded through the module proxy into GOMODCACHE)."""
    info = json.loads(
        output(["go", "mod", "download", "-json", f"{module}@{version}"], env=go_env())
    )
    return Path(info["Dir"]) / sub


def crd_files() -> list[Path]:
    """The CRDs the chart's optional objects need: Gateway API (standard channel),
    prometheus-operator's ServiceMonitor / PrometheusRule, KEDA's ScaledObject and
    TriggerAuthentication — from their Go modules, as published.

    Gateway API also brings GRPCRoute and BackendTLSPolicy, which the chart does not use:
    Traefik's Gateway provider (v3.6, ``pkg/provider/kubernetes/gateway/client.go``) watches
    both unconditionally and waits for every informer's cache to sync before it handles
    any Gateway, so without them it never sets the Gateway Accepted or Programmed."""
    gw = crds_dir("sigs.k8s.io/gateway-api", c.GATEWAY_API_VERSION, "config/crd/standard")
    po = crds_dir(
        "github.com/prometheus-operator/prometheus-operator",
        c.PROMETHEUS_OPERATOR_VERSION,
        "example/prometheus-operator-crd",
    )
    keda = crds_dir("github.com/kedacore/keda/v2", c.KEDA_VERSION, "config/crd/bases")
    files = [
        *(
            gw / f"gateway.networking.k8s.io_{n}.yaml"
            for n in (
                "gatewayclasses",
                "gateways",
                "httproutes",
                "referencegrants",
                "grpcroutes",
                "backendtlspolicies",
            )
        ),
        *(po / f"monitoring.coreos.com_{n}.yaml" for n in ("servicemonitors", "prometheusrules")),
        *(keda / f"keda.sh_{n}.yaml" for n in ("scaledobjects", "triggerauthentications")),
    ]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise RuntimeError(f"CRD files missing from the module zips: {missing}")
    return files


# --- images ------------------------------------------------------------------------------------


class Buildah:
    """buildah with the project's own storage under ``.tools/cluster/buildah`` (never the
    machine's /var/lib/containers), the host network for RUN steps (package downloads) and
    no registry pulls."""

    def __init__(self, root: Path = c.BUILDAH_ROOT) -> None:
        self.root = root

    def cmd(self, *args: str | Path) -> list[str]:
        """A buildah command line with the storage flags."""
        return [
            "buildah",
            "--root",
            str(self.root / "storage"),
            "--runroot",
            str(self.root / "run"),
            "--storage-driver",
            "overlay",
            *(str(a) for a in args),
        ]

    def __call__(self, *args: str | Path, cwd: Path | None = None) -> str:
        return output(self.cmd(*args), cwd=cwd).strip()

    def image_id(self, name: str) -> str | None:
        """The id of a local image, or None."""
        proc = subprocess.run(
            self.cmd("images", "--noheading", "--no-trunc", "--format", "{{.ID}}", name),
            capture_output=True,
            text=True,
        )
        ids = proc.stdout.split()
        return ids[0] if proc.returncode == 0 and ids else None

    def from_scratch(
        self, name: str, files: dict[str, Path], config: Sequence[str], add_tar: Path | None = None
    ) -> None:
        """An image made of ``files`` ({path in the image: file here}) or a root filesystem
        tarball, with ``buildah config`` arguments; committed as ``name``."""
        ctr = self("from", "scratch")
        try:
            if add_tar is not None:
                self("add", ctr, add_tar, "/")
            for dest, src in files.items():
                self("copy", "--chmod", "0755", ctr, src, dest)
            self("config", *config, ctr)
            self("commit", "--rm", ctr, name)
        except BaseException:
            subprocess.run(self.cmd("rm", ctr), capture_output=True)
            raise

    def bud(self, name: str, context: Path, containerfile: Path, args: dict[str, str]) -> None:
        """``buildah bud`` with layer caching, the host network and no pulls."""
        build_args = [x for k, v in args.items() for x in ("--build-arg", f"{k}={v}")]
        run(
            self.cmd(
                "bud",
                "--layers",
                "--network=host",
                "--pull=never",
                "--isolation=chroot",
                *build_args,
                "-f",
                containerfile,
                "-t",
                name,
                context,
            )
        )

    def save(self, name: str, archive: Path) -> None:
        """Write ``name`` as a docker-archive (what ``ctr images import`` reads)."""
        archive.parent.mkdir(parents=True, exist_ok=True)
        tmp = archive.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        run(self.cmd("push", "--quiet", name, f"docker-archive:{tmp}:{name}"))
        tmp.rename(archive)
        archive.with_suffix(".name").write_text(name + "\n")

    def cleanup(self) -> None:
        """Remove working containers and unmount whatever a failed build left mounted."""
        subprocess.run(self.cmd("rm", "--all"), capture_output=True)
        subprocess.run(self.cmd("unmount", "--all"), capture_output=True)


def archive_path(name: str) -> Path:
    """Where the docker-archive of image ``name`` is kept."""
    safe = name.replace("localhost/", "").replace("/", "_").replace(":", "_")
    return c.IMAGE_ARCHIVES / f"{safe}.tar"


def _python_base(b: Buildah, say: Say) -> None:
    """Debian minbase with Python 3.11 (python3, venv, tini, CA certificates): the
    ``PYTHON_IMAGE`` of this machine's builds. The machine's extra CA certificates
    (/usr/local/share/ca-certificates, the TLS re-signing of the registries here) are
    added to its trust store so pip inside a build can verify PyPI."""
    rootfs = c.TOOLS / "tmp" / "rootfs-python"
    shutil.rmtree(rootfs, ignore_errors=True)
    rootfs.parent.mkdir(parents=True, exist_ok=True)
    say(f"debootstrap {c.DEBIAN_SUITE} minbase + python3 (about a minute)")
    run(
        [
            "debootstrap",
            "--variant=minbase",
            "--include=python3,python3-venv,python-is-python3,tini,ca-certificates",
            c.DEBIAN_SUITE,
            rootfs,
            c.DEBIAN_MIRROR,
        ]
    )
    extra = sorted(Path("/usr/local/share/ca-certificates").glob("*.crt"))
    if extra:
        dest = rootfs / "usr/local/share/ca-certificates"
        dest.mkdir(parents=True, exist_ok=True)
        for crt in extra:
            shutil.copy2(crt, dest / crt.name)
        run(["chroot", rootfs, "update-ca-certificates"])
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for f in (rootfs / junk).glob("*"):
            if f.is_file():
                f.unlink()
    tarball = c.TOOLS / "tmp" / "rootfs-python.tar"
    run(["tar", "--numeric-owner", "-C", rootfs, "-cf", tarball, "."])
    b.from_scratch(
        c.PYTHON_IMAGE,
        {},
        [
            "--env",
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--env",
            "LANG=C.UTF-8",
            # pip in a build verifies PyPI against the system trust store (above).
            "--env",
            "PIP_CERT=/etc/ssl/certs/ca-certificates.crt",
            "--cmd",
            "python3",
        ],
        add_tar=tarball,
    )
    shutil.rmtree(rootfs, ignore_errors=True)
    tarball.unlink(missing_ok=True)


def app_image_tag() -> str:
    """The project image's tag, as the Makefile's IMAGE_TAG: ``git describe --dirty``."""
    proc = subprocess.run(
        ["git", "describe", "--always", "--dirty", "--abbrev=12"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    return proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() else "0.1.0"


def build_app_image(b: Buildah, tag: str, say: Say) -> str:
    """The project's Dockerfile built with buildah on the debootstrap base; returns its name."""
    name = f"{c.APP_IMAGE_REPO}:{tag}"
    say(f"buildah bud {name} (PYTHON_IMAGE={c.PYTHON_IMAGE})")
    b.bud(name, ROOT, ROOT / "Dockerfile", {"PYTHON_IMAGE": c.PYTHON_IMAGE})
    return name


def build_images(say: Say = print, app_tag: str | None = None) -> dict[str, float]:
    """Build every image the cluster runs (unless cached) and save the archives; returns
    the seconds spent per image."""
    for tool in ("buildah", "debootstrap"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} is missing: run `make cluster-packages`")
    b = Buildah()
    spent: dict[str, float] = {}

    def step(name: str, stamp_value: str, build: Callable[[], None], save: bool = True) -> None:
        stamp = Stamp(c.IMAGE_ARCHIVES / f".{archive_path(name).stem}.stamp", stamp_value)
        if stamp.fresh and (archive_path(name).is_file() or not save) and b.image_id(name):
            return
        t0 = time.monotonic()
        build()
        if save:  # the build base stays in buildah's storage only: no pod runs it
            b.save(name, archive_path(name))
        stamp.write()
        spent[name] = round(time.monotonic() - t0, 1)
        say(f"image {name}: {spent[name]} s")

    try:
        step(c.PYTHON_IMAGE, f"{c.DEBIAN_SUITE} 1", lambda: _python_base(b, say), save=False)
        base_id = b.image_id(c.PYTHON_IMAGE) or ""
        step(
            c.PAUSE_IMAGE,
            digest([c.BIN / "pause"]),
            lambda: b.from_scratch(
                c.PAUSE_IMAGE,
                {"/pause": c.BIN / "pause"},
                ["--entrypoint", '["/pause"]', "--user", "65535:65535"],
            ),
        )
        step(
            c.COREDNS_IMAGE,
            digest([c.BIN / "coredns"]),
            lambda: b.from_scratch(
                c.COREDNS_IMAGE,
                {"/coredns": c.BIN / "coredns"},
                ["--entrypoint", '["/coredns"]', "--user", "65532:65532"],
            ),
        )
        from devtools.cluster.addons import AddonImage, addon_images

        for image in addon_images() if c.platform_enabled() else ():
            missing = [str(f) for f in image.files.values() if not f.is_file()]
            if missing:  # the cluster's platform step says what is missing, and why
                say(f"image {image.name} skipped: {', '.join(missing)} not built")
                continue

            def build_addon(image: AddonImage = image) -> None:
                b.from_scratch(image.name, image.files, image.config())

            step(image.name, digest(list(image.files.values()), *image.config()), build_addon)
        for name, folder in (
            (c.POSTGRES_IMAGE, "postgresql"),
            (c.REDIS_IMAGE, "redis"),
            (c.MOTO_IMAGE, "moto"),
        ):
            ctx = c.IMAGES_DIR / folder

            def build_server(name: str = name, ctx: Path = ctx) -> None:
                b.bud(name, ctx, ctx / "Containerfile", {"BASE": c.PYTHON_IMAGE})

            step(name, digest([ctx], base_id), build_server)
        tag = app_tag or app_image_tag()
        app = f"{c.APP_IMAGE_REPO}:{tag}"
        inputs = [
            ROOT / p
            for p in (
                "Dockerfile",
                ".dockerignore",
                "requirements.lock",
                "pyproject.toml",
                "alembic.ini",
                "Procfile",
                "libs/exportcore",
                "libs/exportctl",
                "services",
                "migrations",
            )
        ]

        def app_build() -> None:
            build_app_image(b, tag, say)

        step(app, digest([p for p in inputs if p.exists()], base_id), app_build)
        for gone in prune_app_images(b, tag):
            say(f"removed the stale image {gone} (archive and buildah storage)")
    finally:
        b.cleanup()
    return spent


def app_archives() -> dict[str, Path]:
    """{image name: archive} of the project image's saved tags, newest first."""
    found = {}
    for side in c.IMAGE_ARCHIVES.glob("*.name"):
        name = side.read_text().strip()
        archive = side.with_suffix(".tar")
        if name.startswith(f"{c.APP_IMAGE_REPO}:") and archive.is_file():
            found[name] = archive
    return dict(sorted(found.items(), key=lambda kv: kv[1].stat().st_mtime, reverse=True))


def stale_app_images(
    saved: Sequence[str], listed: Sequence[str], tag: str, spare: int = 1
) -> list[str]:
    """The project image's names to remove (pure): every tag but ``tag`` and the ``spare``
    newest other saved ones (``saved``: names with an archive, newest first; ``listed``:
    names in buildah's storage, an interrupted build's included)."""
    current = f"{c.APP_IMAGE_REPO}:{tag}"
    keep = {current, *[n for n in saved if n != current][:spare]}
    return list(dict.fromkeys(n for n in [*saved, *listed] if n not in keep))


def remove_archive(name: str) -> None:
    """Delete the saved archive of image ``name`` with its name file and build stamp."""
    archive = archive_path(name)
    for path in (archive, archive.with_suffix(".name"), archive.parent / f".{archive.stem}.stamp"):
        path.unlink(missing_ok=True)


def prune_app_images(b: Buildah, tag: str, spare: int = 1) -> list[str]:
    """Remove the project image of every tag but ``tag`` and the ``spare`` newest others,
    archive and buildah storage: each commit builds an image of its own (about 430 MB as an
    archive, as much again in buildah's storage), and a cache that kept them all filled the
    disk until the kubelet reported DiskPressure. Returns the names removed."""
    listed = subprocess.run(
        b.cmd("images", "--noheading", "--format", "{{.Name}}:{{.Tag}}", c.APP_IMAGE_REPO),
        capture_output=True,
        text=True,
    ).stdout.split()
    removed = stale_app_images(list(app_archives()), listed, tag, spare)
    for name in removed:
        remove_archive(name)
        subprocess.run(b.cmd("rmi", name), capture_output=True)
    return removed
