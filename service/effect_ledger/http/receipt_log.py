"""The verifiable receipts log's endpoints (API.md section 14), scope ledger:audit, the caller's tenant:
checkpoint, key, tiles and entry bundles (c2sp.org/tlog-tiles), proof files and consistency proofs."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response, get
from litestar.params import FromPath, FromQuery

from effect_ledger.db import receipt_log as repo
from effect_ledger.domain.errors import not_found, validation_failed
from effect_ledger.domain.note import b64
from effect_ledger.domain.receipt_log import origin_of
from effect_ledger.domain.tiles import parse_tile_path
from effect_ledger.http.auth import AUDIT, requires
from effect_ledger.http.context import audit_ledger_of, caller_of
from effect_ledger.http.paging import QueryProblems
from effect_ledger.http.schemas import check_operation_id

TEXT = "text/plain"  # Litestar adds "; charset=utf-8" to text/* answers itself
# private: a tile is the caller's tenant's, chosen by its token, not by the URL; a shared cache must not keep
# it for anyone else (RFC 9111 section 3.5). Vary says the same to any cache that stores it anyway.
IMMUTABLE = "private, max-age=31536000, immutable"
SHORT = "no-cache, max-age=0"


def _settings(request: Request[Any, Any, Any]) -> Any:
    return request.app.state.settings


def _witnesses(request: Request[Any, Any, Any]) -> repo.Witnesses:
    """LOG_WITNESSES and LOG_WITNESS_QUORUM, parsed once when the app was built (http.app)."""
    witnesses: repo.Witnesses = request.app.state.log_witnesses
    return witnesses


class LogController(Controller):
    """The tenant's Merkle log of committed receipts, as the C2SP formats lay it out."""

    path = "/v1/log"
    tags = ("audit",)

    @get("/checkpoint", guards=[requires(AUDIT)], media_type=TEXT)
    async def checkpoint(self, request: Request[Any, Any, Any]) -> Response[Any]:
        """The latest signed checkpoint (a signed note) with every witness cosignature collected for it."""
        QueryProblems(request, ()).check()
        latest = await repo.latest_checkpoint(
            audit_ledger_of(request), caller_of(request).tenant, _witnesses(request)
        )
        if latest is None:
            raise not_found("checkpoint")
        return Response(latest.note, media_type=TEXT, headers={"Cache-Control": SHORT})

    @get("/key", guards=[requires(AUDIT)])
    async def key(self, request: Request[Any, Any, Any]) -> Response[Any]:
        """The log's verifier key for the caller's tenant, the witnesses and the quorum (pin them)."""
        QueryProblems(request, ()).check()
        settings = _settings(request)
        origin = origin_of(settings.log_origin, caller_of(request).tenant)
        signer = request.app.state.log_signer
        if signer is None:  # LOG_ENABLED=false: this service keeps no log, so it has no key to show
            raise not_found("log key")
        vkey = await signer.vkey(origin)
        witnesses = _witnesses(request)
        return Response(
            {
                "origin": origin,
                "vkey": vkey,
                "witnesses": [{"name": w.name, "vkey": w.vkey} for w in witnesses.items],
                "quorum": witnesses.quorum,
            }
        )

    @get("/tile/{rest:path}", guards=[requires(AUDIT)], media_type="application/octet-stream")
    async def tile(self, request: Request[Any, Any, Any], rest: FromPath[str]) -> Response[Any]:
        """A tile `tile/L/N[.p/W]` or entry bundle `tile/entries/N[.p/W]`; a full one never changes."""
        QueryProblems(request, ()).check()
        ref = parse_tile_path("tile/" + rest.lstrip("/"))
        if ref is None:
            raise not_found("tile")
        blob = await repo.read_tile(audit_ledger_of(request), caller_of(request).tenant, ref)
        if blob is None:
            raise not_found("tile")
        cache = SHORT if ref.partial else IMMUTABLE
        return Response(
            blob,
            media_type="application/octet-stream",
            headers={"Cache-Control": cache, "Vary": "Authorization"},
        )

    @get("/proof", guards=[requires(AUDIT)], media_type=TEXT)
    async def proof(
        self, request: Request[Any, Any, Any], operation_id: FromQuery[str | None] = None
    ) -> Response[Any]:
        """A c2sp.org/tlog-proof@v1 file of a committed operation's receipt against the checkpoint."""
        QueryProblems(request, ("operation_id",)).check()
        if not operation_id:
            raise validation_failed([("operation_id", "is required")])
        check_operation_id(operation_id)
        retry = _settings(request).log_checkpoint_seconds + 1
        tenant = caller_of(request).tenant
        text = await repo.proof_of(audit_ledger_of(request), tenant, operation_id, retry, _witnesses(request))
        return Response(text, media_type=TEXT, headers={"Cache-Control": SHORT})

    @get("/consistency", guards=[requires(AUDIT)], media_type=TEXT)
    async def consistency(self, request: Request[Any, Any, Any]) -> Response[Any]:
        """The RFC 9162 consistency proof from size `from` to the current checkpoint (a hash a line),
        or to size `to` (an extension: the size of a checkpoint the caller holds, at most the current
        one). `Effect-Ledger-Tree-Size` names the size the proof ends at: a checkpoint signed between
        the caller's read of one and this request would otherwise make a good proof look bad."""
        QueryProblems(request, ("from", "to")).check()
        old = _tree_size(request, "from")
        if old is None:
            raise validation_failed([("from", "must be a tree size (a non-negative integer)")])
        ledger, tenant = audit_ledger_of(request), caller_of(request).tenant
        proof, size = await repo.consistency_of(ledger, tenant, old, _tree_size(request, "to"))
        return Response(
            "".join(b64(h) + "\n" for h in proof),
            media_type=TEXT,
            headers={"Cache-Control": SHORT, TREE_SIZE: str(size)},
        )


TREE_SIZE = "Effect-Ledger-Tree-Size"


def _tree_size(request: Request[Any, Any, Any], name: str) -> int | None:
    """The query parameter `name` as a tree size; None when it is absent; 422 when it is not one."""
    raw = request.query_params.get(name)
    if raw is None:
        return None
    if not raw.isdigit() or not raw.isascii() or len(raw) > 19:
        raise validation_failed([(name, "must be a tree size (a non-negative integer)")])
    return int(raw)
