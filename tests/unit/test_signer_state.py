"""The in-process signer's state directory is one per database: its host, port and name, never a password."""

from __future__ import annotations

import hashlib

from effect_ledger.settings import Settings
from effect_ledger.signer import state_path


def named(url: str) -> str:
    return state_path(Settings(database_url=url, data_dir="/data")).name


def test_a_socket_directory_in_the_query_names_the_server() -> None:
    # the embedded server's URL: no host in the netloc, its socket directory in the query
    first = named("postgresql://postgres:@/postgres?host=/tmp/a/pgdata")
    second = named("postgresql://postgres:@/postgres?host=/tmp/b/pgdata")
    assert first != second
    assert named("postgresql://postgres:@/postgres?host=/tmp/a/pgdata&sslmode=disable") == first
    assert named("postgresql://postgres:@/postgres?host=/tmp/a/pgdata&port=5433") != first


def test_a_tcp_url_keeps_its_name_and_credentials_are_not_part_of_it() -> None:
    url = "postgresql://app:secret@db1:5432,db2:5432/ledger?target_session_attrs=read-write"
    digest = hashlib.sha256(b"db1:5432,db2:5432/ledger").hexdigest()[:16]
    assert named(url) == f"state-{digest}"  # the name earlier releases gave it
    assert named(url.replace("secret", "other")) == named(url)
