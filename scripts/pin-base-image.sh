#!/usr/bin/env bash
# `make pin-base-image [BASE_IMAGE=python:3.11-slim-bookworm]`: resolve the base image's tag to
# the digest the registry serves for it now and pin the Dockerfile's PYTHON_IMAGE default to
# `tag@sha256:...` (the digest of the multi-platform index, so every architecture stays
# buildable). Needs skopeo or `docker buildx` and the registry; review and commit the change.
# A build with `--build-arg PYTHON_IMAGE=...` (a local base, as the cluster helper builds)
# ignores the default entirely.
set -euo pipefail
cd "$(dirname "$0")/.."

current="$(sed -n 's/^ARG PYTHON_IMAGE=//p' Dockerfile)"
ref="${1:-${current%@*}}"
[ -n "$ref" ] || { echo "no ARG PYTHON_IMAGE=... line in the Dockerfile" >&2; exit 1; }

if command -v skopeo >/dev/null 2>&1; then
  manifest="$(mktemp)"
  trap 'rm -f "$manifest"' EXIT
  skopeo inspect --raw "docker://$ref" >"$manifest"
  digest="$(skopeo manifest-digest "$manifest")"
elif command -v docker >/dev/null 2>&1 && docker buildx version >/dev/null 2>&1; then
  digest="$(docker buildx imagetools inspect "$ref" --format '{{.Manifest.Digest}}')"
else
  echo "neither skopeo nor docker buildx is installed (apt-get install skopeo)" >&2
  exit 1
fi
case "$digest" in
  sha256:[0-9a-f]*) [ "${#digest}" = 71 ] || { echo "unexpected digest: $digest" >&2; exit 1; } ;;
  *) echo "unexpected digest: $digest" >&2; exit 1 ;;
esac
sed -i "s|^ARG PYTHON_IMAGE=.*|ARG PYTHON_IMAGE=$ref@$digest|" Dockerfile
echo "Dockerfile: PYTHON_IMAGE=$ref@$digest"
