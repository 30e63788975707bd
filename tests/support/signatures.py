"""Each handler's signature parsed once per test run, not once per app: the cost of a test's `Service`.

A test's service is a new app (its own database in its settings), and building one made Litestar parse
the signature of every one of its ~110 handlers again: resolving their string annotations
(`typing.get_type_hints`) was ~40% of `create_app`, which itself was most of a small test's set-up
(0.1-0.7 s on the shared machine, against ~20 ms for the test's database). A parsed signature depends
only on the function and the names it resolves against; the handlers are the same module-level
functions in every app, so `install()` memoises `ParsedSignature.from_fn` on exactly those two (a
function defined inside a test is a new object, so a new entry). Every app still registers, validates
and builds its own routes, models and dependency graph from it; only the parsing repeats no more.
Production builds one app per process and never installs this.
"""

from __future__ import annotations

import inspect
from typing import Any

from litestar.utils import signature

_ORIGINAL = signature.ParsedSignature.from_fn.__func__  # type: ignore[attr-defined]
# (function or ("bound", function), the namespace's names and the identity of each value) -> (parsed, the values kept alive)
_PARSED: dict[tuple[Any, tuple[tuple[str, int], ...]], tuple[signature.ParsedSignature, list[Any]]] = {}


def _from_fn(cls: type[signature.ParsedSignature], fn: Any, signature_namespace: dict[str, Any]) -> Any:
    # a controller's handler is a method bound to that app's own controller instance: its signature is
    # its function's, less `self`, whatever the instance
    function = ("bound", fn.__func__) if inspect.ismethod(fn) else fn
    try:
        key = (
            _shape(function),
            tuple(sorted((name, id(value)) for name, value in signature_namespace.items())),
        )
        hash(key)
    except TypeError:  # an unhashable callable: parse it every time, as Litestar does
        return _ORIGINAL(cls, fn, signature_namespace)
    found = _PARSED.get(key)
    if found is None:
        kept = [*signature_namespace.values(), function]  # every object whose id is in the key stays alive
        found = _PARSED[key] = (_ORIGINAL(cls, fn, signature_namespace), kept)
    parsed = found[0]
    # a fresh mapping each time: a caller that edits its parameters edits its own copy
    return cls(
        parameters=dict(parsed.parameters),
        return_type=parsed.return_type,
        original_signature=parsed.original_signature,
    )


def _shape(function: Any) -> Any:
    """What a function's parsed signature depends on. A plain function is itself; a closure (Litestar
    makes an OPTIONS handler per route, and the static-files and OpenAPI handlers, anew in every app:
    56 of an app's 111 handlers) is its code, module namespace, defaults and annotations, so the same
    closure made for another app finds the first one's entry (its objects are kept alive with it, so
    their ids stay theirs)."""
    if not inspect.isfunction(function) or function.__closure__ is None:
        return function
    return (
        function.__code__,
        id(function.__globals__),
        tuple(map(id, function.__defaults__ or ())),
        tuple(sorted((k, id(v)) for k, v in (function.__kwdefaults__ or {}).items())),
        tuple((k, v if isinstance(v, str) else id(v)) for k, v in function.__annotations__.items()),
    )


def install() -> None:
    """Memoise `ParsedSignature.from_fn` for this process (tests/conftest.py, at import)."""
    signature.ParsedSignature.from_fn = classmethod(_from_fn)  # type: ignore[method-assign,assignment]
