"""An error answer without a problem code the client knows (a proxy's page, a WAF's bare status) is
mapped by its status to that status's general problem. Until round 24 the last code listed for a status
won: a bare 403 raised ApprovalDenied, a bare 422 UnsupportedSchema, a bare 409 NotYetLogged."""

from __future__ import annotations

import httpx
import pytest

from effect_ledger.client.errors import CLASSES, parse_retry_after, problem_from_response
from effect_ledger.domain.errors import PROBLEMS

# A status the service answers with one code only is that code (taken from the service's own table,
# not written again here); where it answers with several, the general one is chosen, not a specific
# one that tells the executor something the answer never said.
SHARED = {403: "forbidden", 409: "invalid_transition", 422: "validation_failed"}
CODES_OF: dict[int, list[str]] = {}
for _code, (_status, _) in PROBLEMS.items():
    CODES_OF.setdefault(_status, []).append(_code)
GENERAL = {status: SHARED.get(status, codes[0]) for status, codes in CODES_OF.items()}


def test_every_status_the_service_answers_has_its_general_problem() -> None:
    assert {status for status, codes in CODES_OF.items() if len(codes) > 1} == set(SHARED)
    assert all(PROBLEMS[code][0] == status for status, code in GENERAL.items())
    assert len(GENERAL) == 14 and GENERAL[400] == "malformed_request" and GENERAL[503] == "unavailable"


@pytest.mark.parametrize(("status", "code"), sorted(GENERAL.items()))
@pytest.mark.parametrize("body", ["<html>bare</html>", '{"code": "a_code_this_client_does_not_know"}'])
def test_a_bare_answer_is_its_statuses_general_problem(status: int, code: str, body: str) -> None:
    answer = httpx.Response(
        status, text=body, request=httpx.Request("POST", "http://x/v1/operations/op-1/claim")
    )
    assert type(problem_from_response(answer)) is CLASSES[code]


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("7", 7.0),
        (" 120 ", 120.0),
        ("²", None),
        ("٣", None),
        ("9" * 5000, None),
        ("soon", None),
        (None, None),
    ],
)
def test_retry_after_that_is_no_delay_the_client_can_read_is_none(
    value: str | None, seconds: float | None
) -> None:
    """A Retry-After of non-ASCII digits ("²" is a digit to str.isdigit) or of thousands of digits made
    the client raise ValueError until round 24; it is unreadable, as any other (the retry's own backoff
    applies)."""
    assert parse_retry_after(value) == seconds
