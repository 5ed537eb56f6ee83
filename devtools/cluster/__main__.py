"""``python -m devtools.cluster COMMAND`` — the Makefile's cluster-* targets.

Commands: build (binaries), images, up, down, status, deploy, smoke, drills, env.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from devtools.cluster import config as c


def say(msg: str) -> None:
    """Progress on stderr, prefixed like the other dev tools."""
    print(f"\033[1m[cluster]\033[0m {msg}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m devtools.cluster")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser(
        "build",
        help="build the Kubernetes binaries, crictl, pause, CoreDNS and the platform "
        "(Traefik, KEDA, Jaeger, prometheus-operator, Prometheus)",
    )
    img = sub.add_parser("images", help="build the images with buildah (debootstrap base)")
    img.add_argument("--tag", default=None, help="tag of the project image (default: git describe)")
    sub.add_parser("up", help="start the cluster")
    sub.add_parser("down", help="stop the cluster and check the machine is as it was")
    sub.add_parser("status", help="components and node")
    dep = sub.add_parser("deploy", help="dependencies, helm install with hooks --wait, helm test")
    dep.add_argument("--tag", default=None)
    sub.add_parser("smoke", help="submit, status and presigned download through the Service")
    dr = sub.add_parser("drills", help="pod and rollout drills on the real kubelet")
    dr.add_argument("--only", nargs="*", default=None)
    sub.add_parser("env", help="print the shell exports to use kubectl and helm on the cluster")
    args = parser.parse_args(argv)

    t0 = time.monotonic()
    if args.cmd == "build":
        from devtools.cluster.addons import build_addons
        from devtools.cluster.build import build_binaries

        spent = build_binaries(say)
        say(f"binaries in {c.BIN} ({f'built in {spent:.0f} s' if spent else 'cached'})")
        addons = build_addons(say)
        if c.platform_enabled():
            say(f"platform binaries: {addons or 'all cached'}")
    elif args.cmd == "images":
        from devtools.cluster.build import build_images

        spent_images = build_images(say, args.tag)
        say(f"images ready in {time.monotonic() - t0:.0f} s: {spent_images or 'all cached'}")
    elif args.cmd == "up":
        from devtools.cluster.node import up

        print(json.dumps({k: round(v, 1) for k, v in up(say).items()}))
    elif args.cmd == "down":
        from devtools.cluster.node import down

        left = down(say, check=False)
        return 1 if left else 0
    elif args.cmd == "status":
        from devtools.cluster.node import status

        st = status()
        nodes = st.pop("nodes", "")
        print(json.dumps(st, indent=1))
        print(nodes)
    elif args.cmd == "deploy":
        from devtools.cluster.deploy import deploy

        print(json.dumps(deploy(say, args.tag), indent=1))
    elif args.cmd == "smoke":
        from devtools.cluster.deploy import smoke

        print(json.dumps(smoke(say), indent=1))
    elif args.cmd == "drills":
        from devtools.cluster.drills import run_drills

        results = run_drills(say, args.only)
        return 0 if all(r["verdict"] == "passed" for r in results) else 1
    elif args.cmd == "env":
        print(f"export KUBECONFIG={c.KUBECONFIG}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
