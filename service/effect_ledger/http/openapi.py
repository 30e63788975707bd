"""Document the problem+json answers of docs/api.md section 4 on every /v1 route of the OpenAPI document."""

from __future__ import annotations

from litestar import Litestar
from litestar._openapi.plugin import OpenAPIPlugin
from litestar.openapi.spec import (
    Components,
    OpenAPI,
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Reference,
    Schema,
)

from effect_ledger.domain.errors import PROBLEMS

PROBLEM_SCHEMA = Schema(
    type=OpenAPIType.OBJECT,
    required=["type", "title", "status", "code", "detail"],
    properties={
        "type": Schema(type=OpenAPIType.STRING, description="urn:effect-ledger:problem:<code>"),
        "title": Schema(type=OpenAPIType.STRING),
        "status": Schema(type=OpenAPIType.INTEGER),
        "code": Schema(type=OpenAPIType.STRING, enum=sorted(PROBLEMS)),
        "detail": Schema(type=OpenAPIType.STRING),
        "incident": Schema(type=OpenAPIType.STRING, description="5xx: reference to a protected incident"),
        "operation": Schema(type=OpenAPIType.OBJECT, description="409s: the operation view"),
        "mismatched": Schema(type=OpenAPIType.ARRAY, items=Schema(type=OpenAPIType.STRING)),
        "errors": Schema(
            type=OpenAPIType.ARRAY,
            items=Schema(
                type=OpenAPIType.OBJECT,
                properties={
                    "field": Schema(type=OpenAPIType.STRING),
                    "problem": Schema(type=OpenAPIType.STRING),
                },
            ),
        ),
    },
    additional_properties=True,
)
ALWAYS = (401, 403, 404, 422, 429, 500, 503)
WITH_BODY = (400, 409, 413, 415)


def _problem(status: int) -> OpenAPIResponse:
    codes = ", ".join(code for code, (s, _) in PROBLEMS.items() if s == status)
    return OpenAPIResponse(
        description=f"Problem ({codes})",
        content={
            "application/problem+json": OpenAPIMediaType(schema=Reference("#/components/schemas/Problem"))
        },
    )


class _ProblemsDocumented(OpenAPIPlugin):
    """Litestar's OpenAPI plugin, adding the problem answers when the document is first built."""

    __slots__ = ()

    def provide_openapi(self) -> OpenAPI:
        if not self._openapi:
            self._openapi = self._build_openapi()
            _add_problems(self._openapi)
        return self._openapi


def document_problems(app: Litestar) -> None:
    """Add the Problem schema and every problem answer a /v1 route can give to the document.

    The document is built on its first use (GET /schema, `effect-ledger schema`), not with the app:
    building it costs about as much as the rest of `create_app` together (every worker, every test).
    """
    app.plugins.get(OpenAPIPlugin).__class__ = _ProblemsDocumented


def _add_problems(document: OpenAPI) -> None:
    components = document.components if isinstance(document.components, Components) else Components()
    components.schemas = {**(components.schemas or {}), "Problem": PROBLEM_SCHEMA}
    document.components = components
    for path, item in (document.paths or {}).items():
        if not path.startswith("/v1/"):
            continue
        for method in ("get", "post", "put", "patch", "delete"):
            operation = getattr(item, method, None)
            if operation is None:
                continue
            statuses = ALWAYS + (WITH_BODY if method == "post" else (400,))
            responses = dict(operation.responses or {})
            for status in statuses:
                responses[str(status)] = _problem(status)
            operation.responses = responses
