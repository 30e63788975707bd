"""One default TLS context per test process, not one per HTTP client.

Every `httpx.Client` / `AsyncClient` built without a transport builds its transport's `SSLContext`,
loading certifi's CA bundle (~20-40 ms of CPU), even for the plain-HTTP loopback URLs every test uses:
~4 % of the suite's Python CPU (a py-spy profile of the whole run, round 11), in the tests' own clients,
the product's `LedgerClient` and the workload helpers. The default context (verify=True, no client
certificate, the environment's CA settings) is the same for all of them and is safe to share (an
`SSLContext` is made for many connections), so `install()` builds it once and hands it to every
transport; any other arguments are passed through unchanged. Production never installs this.
"""

from __future__ import annotations

import functools
import ssl
from typing import Any

from httpx import _config
from httpx._transports import default

_ORIGINAL = _config.create_ssl_context


@functools.cache
def _default_context() -> ssl.SSLContext:
    return _ORIGINAL(verify=True, cert=None, trust_env=True)


def _create_ssl_context(verify: Any = True, cert: Any = None, trust_env: bool = True) -> ssl.SSLContext:
    if verify is not True or cert is not None or not trust_env:
        return _ORIGINAL(verify=verify, cert=cert, trust_env=trust_env)
    return _default_context()


def install() -> None:
    """Share the default TLS context in this process (tests/conftest.py, at import)."""
    default.create_ssl_context = _create_ssl_context  # type: ignore[assignment]
