#!/usr/bin/env bash
# Preflight of the laptop walkthrough (docs/kubernetes.md): before `make kind-up`,
# `make minikube-up` and the targets that drive a cluster, name every missing tool and how
# to get it, instead of make's bare "command not found" (exit 127).
#
#   scripts/k8s-preflight.sh kind        kind, kubectl, a container engine that answers
#   scripts/k8s-preflight.sh minikube    minikube, kubectl, a driver (docker / podman) that answers
#
# Exit 0 when everything is there, 1 after listing what is missing (all of it at once).
# CONTAINER_TOOL (docker or podman, as the Makefile chooses) is the engine that is checked.
set -uo pipefail

what="${1:-}"
case "$what" in
  kind | minikube) ;;
  *) echo "usage: $0 kind|minikube" >&2; exit 2 ;;
esac

missing=()

need() {  # need TOOL HOW-TO-GET-IT
  command -v "$1" >/dev/null 2>&1 || missing+=("$1 is not installed: $2")
}

need "$what" "$(case "$what" in
  kind) echo "https://kind.sigs.k8s.io/docs/user/quick-start/#installation (e.g. go install sigs.k8s.io/kind@latest, brew install kind)" ;;
  minikube) echo "https://minikube.sigs.k8s.io/docs/start/ (e.g. brew install minikube)" ;;
esac)"
need kubectl "https://kubernetes.io/docs/tasks/tools/ (e.g. brew install kubectl)"

# kind runs its node as a container of docker (or podman: KIND_EXPERIMENTAL_PROVIDER=podman);
# minikube's default drivers are the same two engines.
engine="${CONTAINER_TOOL:-}"
if [ "$engine" != docker ] && [ "$engine" != podman ]; then
  if command -v docker >/dev/null 2>&1; then engine=docker
  elif command -v podman >/dev/null 2>&1; then engine=podman
  else engine=""
  fi
fi
if [ -z "$engine" ]; then
  missing+=("no container engine: $what runs its cluster in docker or podman. Install Docker (https://docs.docker.com/engine/install/) or Podman (https://podman.io/docs/installation)")
elif ! command -v "$engine" >/dev/null 2>&1; then
  missing+=("$engine (CONTAINER_TOOL) is not installed: https://docs.docker.com/engine/install/ or https://podman.io/docs/installation")
elif ! timeout 20 "$engine" info >/dev/null 2>&1; then
  case "$engine" in
    docker) missing+=("docker is installed but its daemon does not answer (\`docker info\` fails): start Docker (Docker Desktop, or \`sudo systemctl start docker\`) and make sure your user may use it (the docker group)") ;;
    podman) missing+=("podman is installed but \`podman info\` fails: on macOS/Windows start its machine (\`podman machine start\`)") ;;
  esac
elif [ "$engine" = podman ] && [ "$what" = kind ] && [ "${KIND_EXPERIMENTAL_PROVIDER:-}" != podman ] && ! command -v docker >/dev/null 2>&1; then
  missing+=("kind uses docker unless told: export KIND_EXPERIMENTAL_PROVIDER=podman to run it on podman")
fi

if [ "${#missing[@]}" -gt 0 ]; then
  echo "make $what-up cannot start, missing:" >&2
  for m in "${missing[@]}"; do echo "  - $m" >&2; done
  echo "No kind or Docker at all (a CI machine)? make test-cluster runs a real cluster from binaries built here (docs/kubernetes.md, \"The test cluster\")." >&2
  exit 1
fi
echo "preflight: $what, kubectl and $engine are ready"
