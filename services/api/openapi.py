"""The OpenAPI document says what the API answers: problem+json (RFC 9457) for request
validation errors, where FastAPI documents its own JSON shape."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from services.api.problems import PROBLEM_MEDIA_TYPE, TITLES, Problem


def with_problems(app: FastAPI) -> Any:
    """FastAPI documents request validation errors (422) as its own JSON shape; this API
    answers them as problem+json, so the document says so for every operation."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = original()
        problem_ref = {"$ref": "#/components/schemas/Problem"}
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                response = operation.get("responses", {}).get("422")
                if response is not None:
                    response["description"] = TITLES[422]
                    response["content"] = {PROBLEM_MEDIA_TYPE: {"schema": problem_ref}}
        schemas = schema.setdefault("components", {}).setdefault("schemas", {})
        schemas.setdefault(
            "Problem", Problem.model_json_schema(ref_template="#/components/schemas/{model}")
        )
        for unused in ("HTTPValidationError", "ValidationError"):
            schemas.pop(unused, None)
        app.openapi_schema = schema
        return schema

    return openapi


def install(app: FastAPI) -> None:
    """Have ``app`` serve the rewritten document (built once, on the first request)."""
    app.openapi = with_problems(app)  # type: ignore[method-assign]
