#!/usr/bin/env bash
# Zero to curl on a deployed release: create a tenant and an API key inside the api pod,
# import a few notes, submit an export through the gateway (or a Service) with curl, wait for it and
# download it (checking the SHA-256 against the ETag), streamed by the api or, with
# artifacts.downloadMode redirect, from the presigned URL it redirects to.
#
#   k8s/smoke.sh BASE_URL [NAMESPACE] [RELEASE] [KUBE_CONTEXT]
#   e.g. k8s/smoke.sh http://localhost:8080 notes-exports notes-exports kind-notes-exports
set -euo pipefail
BASE_URL="${1:?usage: smoke.sh BASE_URL [NAMESPACE] [RELEASE] [KUBE_CONTEXT]}"
NS="${2:-notes-exports}"
RELEASE="${3:-notes-exports}"
CONTEXT="${4:-}"
KUBECTL=(kubectl -n "$NS")
[ -n "$CONTEXT" ] && KUBECTL+=(--context "$CONTEXT")
# The chart's resource prefix: the release name when it contains the chart name.
case "$RELEASE" in *notes-exports*) FULLNAME="$RELEASE" ;; *) FULLNAME="$RELEASE-notes-exports" ;; esac
API="deploy/${FULLNAME}-api"
TENANT="${SMOKE_TENANT:-smoke}"

say() { printf '\033[1m[smoke]\033[0m %s\n' "$*" >&2; }

say "readiness: $BASE_URL/readyz"
for _ in $(seq 1 60); do
  curl -fsS "$BASE_URL/readyz" >/dev/null 2>&1 && break
  sleep 2
done
curl -fsS "$BASE_URL/readyz" >&2; echo >&2

say "tenant $TENANT, an API key and a few notes (inside the api pod)"
"${KUBECTL[@]}" exec "$API" -- exportctl tenant create "$TENANT" >&2
KEY="$("${KUBECTL[@]}" exec "$API" -- exportctl apikey create "$TENANT" --quiet --label smoke)"
"${KUBECTL[@]}" exec "$API" -- sh -c '
  set -e; d=$(mktemp -d)
  for i in 1 2 3; do printf "# Smoke note %s\n\nWritten by k8s/smoke.sh.\n" "$i" > "$d/note-$i.md"; done
  exportctl notes import "$d" --tenant '"$TENANT"'; rm -rf "$d"' >&2

say "submit an export with curl"
BODY="$(curl -fsS -X POST "$BASE_URL/v1/exports" -H "Authorization: Bearer $KEY" \
  -H 'Content-Type: application/json' -d '{"all": true, "format": "json"}')"
echo "$BODY" >&2
ID="$(printf '%s' "$BODY" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')"

say "wait for $ID"
STATUS=""
for _ in $(seq 1 120); do
  STATUS="$(curl -fsS "$BASE_URL/v1/exports/$ID" -H "Authorization: Bearer $KEY" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])')"
  case "$STATUS" in succeeded|failed|cancelled) break ;; esac
  sleep 1
done
[ "$STATUS" = succeeded ] || { say "export ended as '$STATUS'"; exit 1; }

OUT="$(mktemp)"
# -L: with artifacts.downloadMode redirect the api answers 307 to a presigned URL (curl does
# not send the Authorization header to that other host); the api's ETag comes first.
ETAG="$(curl -fsSL -D - -o "$OUT" "$BASE_URL/v1/exports/$ID/download" -H "Authorization: Bearer $KEY" \
  | tr -d '\r' | awk -F'"' 'tolower($1) ~ /^etag: / && !seen {print $2; seen = 1}')"
SHA="$(sha256sum "$OUT" | cut -d' ' -f1)"
[ "$SHA" = "$ETAG" ] || { say "sha256 $SHA does not match ETag $ETAG"; exit 1; }
say "downloaded $(wc -c <"$OUT") bytes, sha256 $SHA matches the ETag: export $ID succeeded"
rm -f "$OUT"
echo "API_URL=$BASE_URL API_KEY=$KEY"
