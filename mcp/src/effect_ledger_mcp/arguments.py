"""A wrapped tool's arguments checked against its own input schema before anything is claimed or sent.

The official SDK's servers answer arguments their schema refuses with an `isError` result ("Error
executing tool …"), the same answer as a tool that failed while it ran, and not with JSON-RPC's
-32602: the gateway cannot tell the two apart from the answer, and a failed run may have had effects,
so such an answer is recorded `unknown` (`on_tool_error`). Arguments the tool's declared schema refuses
are known not to run: the gateway checks them itself (JSON Schema, the draft the schema names, 2020-12
when it names none), records the call `not_applied` (reason `validation` / `invalid_params`) and sends
nothing upstream (API.md section 16, "invalid params"). An upstream schema that is itself not valid
JSON Schema checks nothing here: the upstream decides, as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError, best_match
from jsonschema.validators import validator_for

MAX_PROBLEM = 300  # characters of the first refusal's text kept for the answer


class ArgumentCheck:
    """One tool's input schema, compiled once."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self._validator: Any = None
        try:
            cls = validator_for(schema, default=jsonschema.Draft202012Validator)
            cls.check_schema(schema)
            self._validator = cls(schema)
        except (SchemaError, TypeError, ValueError, LookupError):
            self._validator = None  # not a schema we can apply: the upstream decides

    def problem(self, arguments: Mapping[str, Any]) -> str | None:
        """Why the schema refuses these arguments (the first error, with its path), or None."""
        if self._validator is None:
            return None
        error = best_match(self._validator.iter_errors(dict(arguments)))
        if error is None:
            return None
        where = "/".join(str(part) for part in error.absolute_path)
        text = f"{where}: {error.message}" if where else error.message
        return str(text)[:MAX_PROBLEM]
