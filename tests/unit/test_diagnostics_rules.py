"""The diagnostics allow-list, purpose rule and screening paths, without a database."""

from __future__ import annotations

import pytest

from effect_ledger.domain.diagnostics import (
    INCIDENT_ID,
    allowed_header,
    check_purpose,
    new_incident_id,
    normalise_headers,
    screen,
)
from effect_ledger.domain.errors import LedgerError


@pytest.mark.parametrize(
    ("name", "allowed"),
    [
        ("retry-after", True),
        ("Retry-After", True),
        ("REQUEST-ID", True),
        ("x-request-id", True),
        ("X-RateLimit-Remaining-Tokens", True),
        ("x-ratelimit-reset", True),
        ("x-ratelimit-", False),
        ("authorization", False),
        ("cookie", False),
        ("set-cookie", False),
        ("x-api-key", False),
        ("retry-after ", False),
        ("x-request-ids", False),
        ("ratelimit-remaining", False),
    ],
)
def test_header_allow_list_is_case_insensitive_and_exact(name: str, allowed: bool) -> None:
    assert allowed_header(name) is allowed


def test_headers_are_lower_cased_and_refused_by_position() -> None:
    assert normalise_headers({"Retry-After": "3", "X-RateLimit-Limit": "10"}) == {
        "retry-after": "3",
        "x-ratelimit-limit": "10",
    }
    with pytest.raises(LedgerError) as refused:
        normalise_headers({"retry-after": "3", "X-Secret-Thing": "v"}, "diagnostics.headers")
    assert refused.value.extensions["errors"][0]["field"] == "diagnostics.headers[1]"
    assert "X-Secret-Thing" not in str(refused.value.extensions)


@pytest.mark.parametrize(
    ("given", "kept"), [("abc", "abc"), ("  ticket 7  ", "ticket 7"), ("x" * 200, "x" * 200)]
)
def test_purpose_is_trimmed(given: str, kept: str) -> None:
    assert check_purpose(given) == kept


@pytest.mark.parametrize("given", [None, "", "ab", "  ab  ", "x" * 201])
def test_purpose_out_of_bounds_is_refused(given: str | None) -> None:
    with pytest.raises(LedgerError) as refused:
        check_purpose(given)
    assert refused.value.code == "validation_failed"


def test_screening_names_fields_with_a_prefix_and_never_values() -> None:
    with pytest.raises(LedgerError) as refused:
        screen({"provider": "ok", "headers": {"x-request-id": "Bearer " + "abcdef123456"}}, "diagnostics.")
    assert refused.value.code == "sensitive_value_rejected"
    assert refused.value.extensions == {
        "errors": [{"field": 'diagnostics.headers["x-request-id"]', "problem": "looks like a credential"}]
    }
    screen({"provider": "example-llm", "provider_request_id": "req_011CSHoEeqs5C35K2UUqR7Fy"})


def test_incident_ids_fit_the_table_check_and_are_unique() -> None:
    ids = {new_incident_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(INCIDENT_ID.match(i) for i in ids)
