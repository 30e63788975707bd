"""POST /v1/recovery/decide (API.md section 10): the pure next-action decision, for any valid token."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from litestar import Controller, post
from litestar.params import JSONBody
from msgspec import Meta, Struct

from effect_ledger.domain.errors import validation_failed
from effect_ledger.domain.recovery import MAX_SAFE_INTEGER, InvalidRecoveryInput, RecoveryInput, decide
from effect_ledger.http.auth import requires
from effect_ledger.http.schemas import strict

Budget = Annotated[int, Meta(ge=1, le=MAX_SAFE_INTEGER)]
Moment = Annotated[int, Meta(ge=0, le=MAX_SAFE_INTEGER)]


class DecideBody(Struct, forbid_unknown_fields=True):
    """The facts about a failed attempt and the budget left (every field but retry_after_ms required)."""

    attempts: Budget
    maximum_attempts: Budget
    minimum_attempt_ms: Budget
    base_delay_ms: Budget
    maximum_delay_ms: Budget
    now_ms: Moment
    deadline_ms: Moment
    jitter: Annotated[float, Meta(ge=0, lt=1)]
    # The contract leaves the set of causes open ("transient|refused|cancelled|invalid|…"): only
    # "transient" can lead to a retry, so any other non-empty name is accepted and stops.
    cause: Annotated[str, Meta(min_length=1, max_length=64)]
    output_visible: bool
    effects: Literal["none", "committed", "unknown"]
    retry_after_ms: Moment | None = None


class RecoveryController(Controller):
    """The recovery decision as a service, so that clients in any language share one rule."""

    path = "/v1/recovery"
    tags = ("recovery",)

    @post("/decide", guards=[requires()], status_code=200, **strict(DecideBody))
    async def decide_recovery(self, data: JSONBody[DecideBody]) -> dict[str, Any]:
        """Reconcile, stop (with a reason) or retry (with a delay), by the rules of API.md section 10."""
        inp = RecoveryInput(
            attempts=data.attempts,
            maximum_attempts=data.maximum_attempts,
            minimum_attempt_ms=data.minimum_attempt_ms,
            base_delay_ms=data.base_delay_ms,
            maximum_delay_ms=data.maximum_delay_ms,
            now_ms=data.now_ms,
            deadline_ms=data.deadline_ms,
            retry_after_ms=data.retry_after_ms,
            jitter=data.jitter,
            cause=data.cause,
            output_visible=data.output_visible,
            effects=data.effects,
        )
        try:
            decision = decide(inp)
        except InvalidRecoveryInput as exc:
            # The struct's constraints already hold every rule; this is the domain's second word.
            raise validation_failed(exc.problems) from None
        return decision.to_json()
