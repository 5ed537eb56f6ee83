"""``GET /v1/manifest-keys``: the public keys that sign export manifests, as a JWK Set.

Public by design (no API key): a client verifies what it was handed without credentials
(docs/api.md "Manifests"). RFC 7517 JWK Set of RFC 8037 ``OKP``/``Ed25519`` keys, the
current key first, then ``MANIFEST_PREVIOUS_PUBLIC_KEYS`` (a rotation).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from exportcore.manifests import jwk
from services.api.deps import SettingsDep

router = APIRouter(prefix="/v1", tags=["manifests"])


class JwkSetResponse(JSONResponse):
    """A JWK Set body with its registered media type (RFC 7517 section 8.5,
    ``application/jwk-set+json``), which the OpenAPI document then names."""

    media_type = "application/jwk-set+json"


@router.get(
    "/manifest-keys",
    summary="Public keys of manifest signatures (JWK Set)",
    response_model=dict[str, list[dict[str, str]]],
    response_class=JwkSetResponse,
)
def manifest_keys(settings: SettingsDep) -> JwkSetResponse:
    """``{"keys": [JWK, ...]}``: empty when the deployment signs no manifests."""
    signer = settings.manifest_signer()
    body: dict[str, Any] = {"keys": [jwk(k) for k in signer.public_keys()] if signer else []}
    return JwkSetResponse(
        body,
        headers={"Cache-Control": "public, max-age=300"},
    )
