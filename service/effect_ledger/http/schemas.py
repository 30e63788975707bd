"""Request bodies as strict msgspec structs (unknown fields rejected), plus the checks types cannot say."""

from __future__ import annotations

import re
from collections.abc import Generator
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import msgspec
from litestar.dto import AbstractDTO
from litestar.dto.data_structures import DTOFieldDefinition
from litestar.openapi.spec import Reference, Schema
from litestar.params import Parameter
from litestar.typing import FieldDefinition
from msgspec import UNSET, Meta, Struct, UnsetType

from effect_ledger.domain.canonical import CanonicalizationError, canonical_json, digest_of_canonical
from effect_ledger.domain.diagnostics import Cause, Phase
from effect_ledger.domain.errors import LedgerError, validation_failed
from effect_ledger.domain.model import OPERATION_ID_PATTERN
from effect_ledger.domain.timefmt import format_ts, parse_ts

if TYPE_CHECKING:
    from litestar._openapi.schema_generation import SchemaCreator

OPERATION_ID = re.compile(OPERATION_ID_PATTERN)
DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
MAX_INTENT_BYTES = 64 * 1024
MAX_RESULT_BYTES = 16 * 1024

LeaseSeconds = Annotated[int, Meta(ge=1, le=3600)]
Name = Annotated[str, Meta(min_length=1, max_length=200)]
Token = Annotated[str, Meta(min_length=1, max_length=200)]
Digest = Annotated[str, Meta(pattern=DIGEST_PATTERN)]
Outcome = Literal["committed", "not_applied", "unknown"]
Category = Literal["rejected", "validation", "unauthorized", "cancelled_before_submit", "other"]
HeaderName = Annotated[str, Meta(min_length=1, max_length=100)]
HeaderValue = Annotated[str, Meta(max_length=256)]


EffectRef = Annotated[str, Meta(max_length=256)]


class ClaimSubmit(Struct, forbid_unknown_fields=True):
    """Claim-and-submit: a granted attempt is submitted in the same transaction (API.md section 6)."""

    effect_ref: EffectRef | None = None


class ClaimBody(Struct, forbid_unknown_fields=True):
    """POST /v1/operations/{id}/claim."""

    tool: Name
    tool_version: Annotated[str, Meta(min_length=1, max_length=100)]
    intent: Any | UnsetType = UNSET
    intent_digest: Digest | UnsetType = UNSET
    lease_seconds: LeaseSeconds = 30
    client_nonce: Annotated[str, Meta(min_length=16, max_length=128)] | None = None
    submit: ClaimSubmit | None = None
    approval_note: Annotated[str, Meta(max_length=2000)] | None = None  # shown to approvers (section 15)


class SubmitBody(Struct, forbid_unknown_fields=True):
    """POST /v1/operations/{id}/submit."""

    token: Token
    effect_ref: EffectRef | None = None
    lease_seconds: LeaseSeconds | None = None


class HeartbeatBody(Struct, forbid_unknown_fields=True):
    """POST /v1/operations/{id}/heartbeat."""

    token: Token
    lease_seconds: LeaseSeconds | None = None


class ReceiptBody(Struct, forbid_unknown_fields=True):
    """A receipt as reported; recorded_by and recorded_at are added by the ledger."""

    external_ref: Annotated[str, Meta(min_length=1, max_length=512)] | None = None
    result_digest: Digest | None = None
    result: Any = None
    observed_at: str | None = None


class ReasonBody(Struct, forbid_unknown_fields=True):
    """Why an effect did not apply."""

    category: Category
    detail_code: Annotated[str, Meta(min_length=1, max_length=100)] | None = None


class DiagnosticsBody(Struct, forbid_unknown_fields=True):
    """The diagnostics fields of docs/api.md section 9 (POST /v1/diagnostics and complete's `diagnostics`)."""

    operation_id: Annotated[str, Meta(pattern=OPERATION_ID.pattern)] | None = None
    attempt: Annotated[int, Meta(ge=1, le=2**31 - 1)] | None = None
    phase: Phase | None = None
    cause: Cause | None = None
    http_status: Annotated[int, Meta(ge=100, le=599)] | None = None
    provider: Annotated[str, Meta(min_length=1, max_length=100)] | None = None
    provider_request_id: Annotated[str, Meta(min_length=1, max_length=256)] | None = None
    retryable_hint: bool | None = None
    elapsed_ms: Annotated[int, Meta(ge=0, le=2**53 - 1)] | None = None
    detail_code: Annotated[str, Meta(min_length=1, max_length=100)] | None = None
    headers: Annotated[dict[HeaderName, HeaderValue], Meta(max_length=32)] | None = None
    report_id: Annotated[str, Meta(min_length=16, max_length=128)] | None = None


class CompleteBody(Struct, forbid_unknown_fields=True):
    """POST /v1/operations/{id}/complete."""

    token: Token
    outcome: Outcome
    receipt: ReceiptBody | None = None
    reason: ReasonBody | None = None
    diagnostics: DiagnosticsBody | None = None


S = TypeVar("S", bound=Struct)
_AT_PATH = re.compile(r" - at `\$\.?([^`]*)`$")


def decode_strict(raw: bytes, kind: type[S]) -> S:
    """Decode a request body strictly into its struct ("30" is not 30): 400 when it is not JSON or not
    an object, 422 naming the field when it is JSON that breaks the contract (RecursionError, for a
    nesting deeper than the decoder follows, is answered 422 by the exception handlers)."""
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError too
        _refuse_json(raw)  # raises 400 when the body is not a JSON object at all
        if not isinstance(exc, msgspec.ValidationError):
            raise LedgerError("malformed_request", "The body is not valid JSON.") from None
        raise _invalid(exc) from None


def strict_convert(value: Any, kind: type[S]) -> S:
    """Convert already-decoded JSON strictly into `kind`, with the same 422 as decode_strict."""
    try:
        return msgspec.convert(value, type=kind)
    except msgspec.ValidationError as exc:
        raise _invalid(exc) from None


def _invalid(exc: msgspec.ValidationError) -> Exception:
    message = str(exc)
    located = _AT_PATH.search(message)
    field = located.group(1) if located and located.group(1) else "body"
    return validation_failed([_describe(_AT_PATH.sub("", message), field)])


def _refuse_json(raw: bytes) -> None:
    """On the error path only: the body as plain JSON. Not JSON (or numbers no JSON value can hold)
    -> 400; too deep -> RecursionError (422); not an object -> 400. Else the struct was broken (422)."""
    try:
        value = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        raise LedgerError("malformed_request", "The body is not valid JSON.") from None
    if not isinstance(value, dict):
        raise LedgerError("malformed_request", "The body must be a JSON object.")


class StrictBody(AbstractDTO[S]):
    """The one way a request body is read: decoded strictly, once, into its msgspec struct.

    Litestar's own decoding of a `data` parameter converts leniently ("30" becomes 30); a DTO's
    decode_bytes replaces it (the signature model then takes the value as it is). The OpenAPI request
    schema is the struct's own, exactly as without the DTO. Responses are not touched (return_dto=None).
    """

    @classmethod
    def generate_field_definitions(cls, model_type: type[Any]) -> Generator[DTOFieldDefinition, None, None]:
        """Not used: nothing is transferred field by field."""
        yield from ()

    @classmethod
    def detect_nested_field(cls, field_definition: FieldDefinition) -> bool:
        """Not used: the struct is decoded whole."""
        return False

    @classmethod
    def create_for_field_definition(
        cls, field_definition: FieldDefinition, handler_id: str, backend_cls: type[Any] | None = None
    ) -> None:
        """No transfer backend: decode_bytes decodes directly."""

    @classmethod
    def create_openapi_schema(
        cls, field_definition: FieldDefinition, handler_id: str, schema_creator: SchemaCreator
    ) -> Reference | Schema:
        """The struct's schema, as Litestar documents a plain `data: Struct` parameter."""
        return schema_creator.for_field_definition(FieldDefinition.from_annotation(cls.model_type))

    def decode_bytes(self, value: bytes) -> Any:
        """The body as its struct, strictly (see decode_strict)."""
        return decode_strict(value, self.model_type)


def strict(kind: type[S]) -> dict[str, Any]:
    """Route options that decode `data` with StrictBody and leave the answer alone."""
    return {"dto": StrictBody[kind], "return_dto": None}  # type: ignore[valid-type]


def _describe(message: str, field: str) -> tuple[str, str]:
    """(field, problem) from a msgspec message, keeping only controlled words."""
    named = re.search(r"field `([^`]+)`", message)
    if message.startswith("Object contains unknown field") and named:
        return (f"{field}.{named.group(1)}" if field != "body" else named.group(1)), "unknown field"
    if message.startswith("Object missing required field") and named:
        return (f"{field}.{named.group(1)}" if field != "body" else named.group(1)), "required"
    expected = re.match(r"^Expected `([^`]+)`(.*?)(?:, got `([^`]+)`)?$", message)
    if expected:
        return field, f"must be {expected.group(1)}{expected.group(2)}"[:120]
    if message.startswith("Invalid enum value"):
        return field, "is not one of the allowed values"
    return field, "is invalid"


# The one path type of an operation ID: checked by the route's signature (422 on `operation_id`).
OperationId = Annotated[
    str,
    Parameter(
        description="1-200 characters of [A-Za-z0-9._:~-]",
        pattern=OPERATION_ID.pattern,
        min_length=1,
        max_length=200,
    ),
]


def check_operation_id(operation_id: str) -> None:
    """Operation IDs are 1-200 characters of [A-Za-z0-9._:~-]."""
    if not OPERATION_ID.match(operation_id):
        raise validation_failed([("operation_id", "must be 1-200 characters of [A-Za-z0-9._:~-]")])


def claim_digest(body: ClaimBody) -> str:
    """The intent digest of a claim: computed from `intent` or taken from `intent_digest`, never both."""
    has_intent, has_digest = body.intent is not UNSET, body.intent_digest is not UNSET
    if has_intent == has_digest:
        raise validation_failed([("intent", "send exactly one of intent and intent_digest")])
    if isinstance(body.intent_digest, str):
        return body.intent_digest
    try:
        canonical = canonical_json(body.intent)
    except CanonicalizationError:
        raise validation_failed([("intent", "is not representable as canonical JSON")]) from None
    if len(canonical) > MAX_INTENT_BYTES:
        raise validation_failed([("intent", "is larger than 64 KiB")])
    return digest_of_canonical(canonical)  # intent_digest's value, the canonical form computed once


def receipt_content(
    receipt: ReceiptBody | None, outcome: str, field: str = "receipt"
) -> dict[str, Any] | None:
    """The receipt's content fields, normalised; committed needs one, other outcomes none."""
    if outcome != "committed":
        if receipt is not None:
            raise validation_failed([(field, "only a committed outcome carries a receipt")])
        return None
    if receipt is None:
        raise validation_failed([(field, "a committed outcome needs a receipt")])
    if receipt.external_ref is None and receipt.result_digest is None and receipt.result is None:
        raise validation_failed([(field, "needs at least one of external_ref, result_digest, result")])
    try:
        if receipt.result is not None and len(canonical_json(receipt.result)) > MAX_RESULT_BYTES:
            raise validation_failed([(f"{field}.result", "is larger than 16 KiB")])
    except CanonicalizationError:
        raise validation_failed([(f"{field}.result", "is not representable as canonical JSON")]) from None
    observed = None
    if receipt.observed_at is not None:
        try:
            observed = format_ts(parse_ts(receipt.observed_at))
        except ValueError:
            raise validation_failed([(f"{field}.observed_at", "must be an RFC 3339 timestamp")]) from None
    return {
        "external_ref": receipt.external_ref,
        "result_digest": receipt.result_digest,
        "result": receipt.result,
        "observed_at": observed,
    }


def reason_content(reason: ReasonBody | None, outcome: str) -> dict[str, Any] | None:
    """The reason of a not_applied outcome; other outcomes carry none."""
    if outcome != "not_applied":
        if reason is not None:
            raise validation_failed([("reason", "only a not_applied outcome carries a reason")])
        return None
    if reason is None:
        raise validation_failed([("reason", "a not_applied outcome needs a reason")])
    return {"category": reason.category, "detail_code": reason.detail_code}


def to_builtins(value: Struct) -> dict[str, Any]:
    """A struct as plain JSON-ready data."""
    result = msgspec.to_builtins(value)
    assert isinstance(result, dict)
    return result
