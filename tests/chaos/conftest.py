"""Fixtures of the chaos scenarios that build PostgreSQL servers of their own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.replication import Template


@pytest.fixture(scope="session")
def pg_template() -> Iterator[Template]:
    """One migrated, stopped cluster per run; the failover and restore scenarios copy it."""
    template = Template()
    try:
        template.build()
        yield template
    finally:
        template.remove()
