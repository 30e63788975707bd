"""Test databases: one migrated template, and a database reused from test to test while it stays clean.

Cloning the template costs a CREATE DATABASE (~0.1 s) and a DROP per test; a test that only writes rows
gets the same thing cheaper: the database of the previous test, emptied. After each test the database's
catalogue is compared with the template's (every schema object, grant, policy, trigger, setting and
planner statistic); when the test changed any of it, that database is dropped and the next test gets a
fresh clone. So a test may still REVOKE, ALTER or ANALYZE: it only costs the one clone after it.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from urllib.parse import urlsplit

import asyncpg

from support.database import with_database

# Everything a test could change in a database other than its rows, as one text per catalogue. Columns
# that TRUNCATE, CLUSTER or VACUUM change (relfilenode, relpages, reltuples, …) are left out; object IDs
# are kept (a clone keeps the template's, so a dropped and re-created object differs).
USER_OBJECT = 16384  # FirstNormalObjectId: what migrations create, never the system's own
FINGERPRINT = f"""
SELECT concat_ws(' | ',
  (SELECT string_agg(concat_ws(',', oid, nspname, nspacl), ';' ORDER BY oid)
     FROM pg_namespace WHERE oid >= {USER_OBJECT}),
  (SELECT string_agg(concat_ws(',', oid, relname, relnamespace, relkind, relowner, relacl, reloptions,
            relrowsecurity, relforcerowsecurity, relpersistence, relnatts, relchecks, relreplident),
            ';' ORDER BY oid)
     FROM pg_class WHERE oid >= {USER_OBJECT}),
  (SELECT string_agg(concat_ws(',', attrelid, attnum, attname, atttypid, attnotnull, atthasdef,
            attisdropped, attacl, attoptions, attstattarget), ';' ORDER BY attrelid, attnum)
     FROM pg_attribute WHERE attrelid >= {USER_OBJECT}),
  (SELECT string_agg(concat_ws(',', adrelid, adnum, pg_get_expr(adbin, adrelid)), ';' ORDER BY oid)
     FROM pg_attrdef WHERE oid >= {USER_OBJECT}),
  (SELECT string_agg(concat_ws(',', oid, proname, pronamespace, md5(prosrc), proacl, proconfig,
            prosecdef, provolatile, proowner), ';' ORDER BY oid)
     FROM pg_proc WHERE oid >= {USER_OBJECT}),
  (SELECT string_agg(concat_ws(',', oid, tgrelid, tgname, tgfoid, tgtype, tgenabled), ';' ORDER BY oid)
     FROM pg_trigger WHERE oid >= {USER_OBJECT}),
  (SELECT string_agg(concat_ws(',', oid, polrelid, polname, polcmd, polpermissive, polroles,
            pg_get_expr(polqual, polrelid), pg_get_expr(polwithcheck, polrelid)), ';' ORDER BY oid)
     FROM pg_policy WHERE oid >= {USER_OBJECT}),
  (SELECT string_agg(concat_ws(',', oid, conname, conrelid, pg_get_constraintdef(oid), convalidated),
            ';' ORDER BY oid)
     FROM pg_constraint WHERE oid >= {USER_OBJECT}),
  (SELECT string_agg(concat_ws(',', indexrelid, indisvalid, indisready, pg_get_indexdef(indexrelid)),
            ';' ORDER BY indexrelid)
     FROM pg_index WHERE indexrelid >= {USER_OBJECT}),
  (SELECT string_agg(concat_ws(',', oid, ev_class, rulename, ev_enabled, md5(pg_get_ruledef(oid))),
            ';' ORDER BY oid)
     FROM pg_rewrite WHERE oid >= {USER_OBJECT}),
  (SELECT string_agg(concat_ws(',', oid, typname, typnamespace, typacl), ';' ORDER BY oid)
     FROM pg_type WHERE oid >= {USER_OBJECT}),
  (SELECT string_agg(concat_ws(',', oid, extname, extversion), ';' ORDER BY oid) FROM pg_extension),
  (SELECT string_agg(concat_ws(',', oid, defaclrole, defaclnamespace, defaclobjtype, defaclacl),
            ';' ORDER BY oid) FROM pg_default_acl),
  (SELECT string_agg(concat_ws(',', oid, evtname, evtenabled), ';' ORDER BY oid) FROM pg_event_trigger),
  (SELECT string_agg(concat_ws(',', setrole, setconfig), ';' ORDER BY setrole)
     FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase
    WHERE d.datname = current_database()),
  (SELECT concat_ws(',', datconnlimit, datallowconn, datacl) FROM pg_database
    WHERE datname = current_database()),
  (SELECT 'statistics ' || count(*) FROM pg_statistic WHERE starelid >= {USER_OBJECT}),
  (SELECT 'extended statistics ' || count(*) FROM pg_statistic_ext),
  (SELECT 'large objects ' || count(*) FROM pg_largeobject_metadata),
  (SELECT 'prepared ' || count(*) FROM pg_prepared_xacts WHERE database = current_database())
)
"""

# Every table and sequence the migrations made (whatever schema: later migrations' tables too).
USER_TABLES = f"""
SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.oid >= {USER_OBJECT} AND c.relkind IN ('r', 'p') AND NOT c.relispartition
 ORDER BY 1
"""
USER_SEQUENCES = f"""
SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.oid >= {USER_OBJECT} AND c.relkind = 'S' ORDER BY 1
"""
OTHERS = (
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()"
)


async def fingerprint(url: str) -> str:
    """The database's catalogue (everything but its rows) as one text."""
    conn = await asyncpg.connect(url)
    try:
        return str(await conn.fetchval(FINGERPRINT))
    finally:
        await conn.close()


def filled_query(tables: list[str]) -> str:
    """One round trip: which of `tables` hold rows."""
    cases = ", ".join(f"CASE WHEN EXISTS (SELECT FROM {t}) THEN '{t}' END" for t in tables)
    return f"SELECT array_remove(ARRAY[{cases or 'NULL'}]::text[], NULL)"


def contents_query(tables: list[str]) -> str:
    """One round trip: a digest of every row of `tables`."""
    digests = ", ".join(
        f"(SELECT '{t} ' || coalesce(md5(string_agg(x::text, ',' ORDER BY x::text)), '') FROM {t} x)"
        for t in tables
    )
    return f"SELECT concat_ws(' | ', {digests or 'NULL'})"


@dataclass(frozen=True)
class Catalogue:
    """What a clean database holds besides empty tables: the template's catalogue and its own rows."""

    fingerprint: str
    tables: list[str]  # emptied after a test
    seeded: list[str]  # tables with rows in the template (alembic_version): kept, their rows checked
    seed_digest: str
    sequences: list[str]


async def catalogue(url: str) -> Catalogue:
    """The template's catalogue (a clean database has the same)."""
    conn = await asyncpg.connect(url)
    try:
        found = str(await conn.fetchval(FINGERPRINT))
        tables = [r[0] for r in await conn.fetch(USER_TABLES)]
        seeded = list(await conn.fetchval(filled_query(tables)))
        digest = str(await conn.fetchval(contents_query(seeded)))
        sequences = [r[0] for r in await conn.fetch(USER_SEQUENCES)]
    finally:
        await conn.close()
    return Catalogue(found, [t for t in tables if t not in seeded], seeded, digest, sequences)


class Databases:
    """Hands each test a clean migrated database: the previous test's, emptied, or a fresh clone."""

    def __init__(self, admin_url: str, template: str, template_catalogue: Catalogue) -> None:
        self.admin_url = admin_url
        self.template = template
        self.catalogue = template_catalogue
        self.filled = filled_query(template_catalogue.tables)  # only those are truncated (new files)
        self.contents = contents_query(template_catalogue.seeded)
        self.counter = itertools.count()
        self.clean: str | None = None  # the name of an emptied database that matches the template
        self.clones = 0
        self.reuses = 0
        self._admin: asyncpg.Connection | None = None  # one owner connection for the run's DDL

    async def ddl(self, statement: str) -> None:
        """Run one statement on the owner connection that renames, clones and drops: opened once, and
        opened again when it broke (a test that terminated every backend of the server)."""
        for attempt in (1, 2):
            if self._admin is None or self._admin.is_closed():
                self._admin = await asyncpg.connect(self.admin_url)
            try:
                await self._admin.execute(statement)
                return
            except (asyncpg.ConnectionDoesNotExistError, asyncpg.InterfaceError, OSError):
                if self._admin is not None:
                    self._admin.terminate()
                self._admin = None
                if attempt == 2:
                    raise

    async def take(self) -> str:
        """A clean database's URL (the caller gives it back with `give_back`)."""
        name, self.clean = self.clean, None
        if name is None:
            name = await self.clone()
        else:
            try:
                name = await self.rename(name)
                self.reuses += 1
            except asyncpg.ObjectInUseError:
                # the last test's sessions still closing (a service's workers on a very busy machine): that
                # database is dropped by force, this test gets a fresh clone
                await self.drop(name)
                name = await self.clone()
        return with_database(self.admin_url, name)

    async def rename(self, name: str) -> str:
        """An emptied database under a new name: what outlives a test outside the database and is keyed
        by its name (the receipts log's signer state, DATA_DIR/log-signer/state-<host, port, name>)
        never takes the next test's empty database for a restored, older copy (API.md section 14)."""
        fresh = f"el_test_{os.getpid()}_{next(self.counter)}"
        await self.ddl(f'ALTER DATABASE "{name}" RENAME TO "{fresh}"')
        return fresh

    async def clone(self) -> str:
        """A new database cloned from the template."""
        name = f"el_test_{os.getpid()}_{next(self.counter)}"
        await self.ddl(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
        self.clones += 1
        return name

    async def give_back(self, url: str) -> None:
        """Empty the database for the next test, or drop it when the test changed more than its rows."""
        name = urlsplit(url).path.lstrip("/")
        if await self.wipe(url, name):
            self.clean = name
        else:
            await self.drop(name)

    async def wipe(self, url: str, name: str) -> bool:
        """Whether the database now matches the template, rows and all (False: it must go)."""
        try:
            conn = await asyncpg.connect(url, timeout=10)
        except (OSError, asyncpg.PostgresError, TimeoutError):
            return False  # e.g. the test set CONNECTION LIMIT 0 and failed before lifting it
        try:
            await conn.execute(OTHERS.replace("$1", "current_database()"))  # what the test left open
            if await conn.fetchval(FINGERPRINT) != self.catalogue.fingerprint:
                return False
            if await conn.fetchval(self.contents) != self.catalogue.seed_digest:
                return False
            tables = list(await conn.fetchval(self.filled))
            async with conn.transaction():
                await conn.execute("SET LOCAL lock_timeout = '10s'")
                # the append-only triggers refuse TRUNCATE from every role but a replica's apply
                await conn.execute("SET LOCAL session_replication_role = replica")
                if tables:
                    await conn.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")
                for sequence in self.catalogue.sequences:
                    await conn.execute(f"ALTER SEQUENCE {sequence} RESTART")
            return True
        except (OSError, asyncpg.PostgresError, TimeoutError):
            return False
        finally:
            await conn.close()

    async def drop(self, name: str) -> None:
        await self.ddl(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    async def close(self) -> None:
        """Drop the clean database kept for a next test, and close the owner connection."""
        if self.clean is not None:
            await self.drop(self.clean)
            self.clean = None
        if self._admin is not None:
            await self._admin.close()
            self._admin = None
