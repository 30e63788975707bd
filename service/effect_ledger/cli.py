"""One entry point, `effect-ledger`: each subcommand is a row of COMMANDS, its handler imported to run."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import shutil
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from effect_ledger.settings import Settings, SettingsError, variable

Handler = Callable[[argparse.Namespace, Settings], int]


@dataclass(frozen=True)
class Command:
    """One subcommand: what it does, and where its handler (and its own flags, if any) live."""

    help: str
    handler: str  # "module:function", imported only when the subcommand runs
    flags: str | None = None  # "module:function" that adds the subcommand's own flags to its parser
    setting_flags: bool = True  # every setting as a flag (--port, --database-url, ...)
    install: str | None = None  # how to install the optional part it needs, when that is absent


COMMANDS: dict[str, Command] = {
    "serve": Command(
        "serve the HTTP API (over an embedded PostgreSQL in --data-dir when no database URL is set)",
        "effect_ledger.cli:serve",
    ),
    "migrate": Command(
        "migrate the configured (or the embedded) database to the newest schema, then exit",
        "effect_ledger.cli:migrate_command",
    ),
    "sweep": Command(
        "mark submitted operations whose lease expired as unknown, once (for a CronJob)",
        "effect_ledger.maintenance_cli:sweep_command",
    ),
    "purge": Command(
        "delete terminal operations and diagnostics past their retention, once (for a CronJob)",
        "effect_ledger.maintenance_cli:purge_command",
    ),
    "demo": Command(
        "run the reference scenario end to end against a fresh database (exit 0: every expectation held)",
        "effect_ledger.demo.command:demo_command",
    ),
    "token": Command(
        "print a development token signed with the configured (or development) HS256 secret",
        "effect_ledger.cli:token_command",
        flags="effect_ledger.cli:token_flags",
    ),
    "config": Command(
        "print every setting's value in effect (after validation; secrets hidden), then exit",
        "effect_ledger.cli:config_command",
    ),
    "schema": Command(
        "regenerate schema/ledger.sql, schema/openapi.json and docs/configuration.md (--check: report)",
        "effect_ledger.schema_cli:schema_command",
        flags="effect_ledger.schema_cli:schema_flags",
        setting_flags=False,
    ),
    "log-signer": Command(
        "serve the receipts log's signer on a local address: the Ed25519 key and its state stay here",
        "effect_ledger.log_cli:signer_command",
        flags="effect_ledger.log_cli:signer_flags",
    ),
    "log-key": Command(
        "print a tenant's log origin, verifier key, witnesses and quorum (for auditors to pin)",
        "effect_ledger.log_cli:key_command",
        flags="effect_ledger.log_cli:key_flags",
    ),
    "witness": Command(
        "run a small c2sp.org/tlog-witness (add-checkpoint, persisted state) for the receipts logs",
        "effect_ledger.log_cli:witness_command",
        flags="effect_ledger.log_cli:witness_flags",
        setting_flags=False,
    ),
    "log-recover": Command(
        "after a restore behind the signer: re-create lost receipts from mirrored entries, or accept a loss",
        "effect_ledger.log_cli:recover_command",
        flags="effect_ledger.log_cli:recover_flags",
    ),
    "bench": Command(
        "measure effect cycles against the PostgreSQL limit (distribution effect-ledger-bench, ./bench)",
        "effect_ledger_bench.command:bench_command",
        flags="effect_ledger_bench.command:add_bench_flags",
        setting_flags=False,
        install="pip install effect-ledger-bench (./bench in the repository)",
    ),
}


def _load(target: str) -> Any:
    """The function named "module:function", imported now; ModuleNotFoundError if its module is absent."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """Every setting as a flag named like its variable: EFFECT_LEDGER_JWT_SECRET <-> --jwt-secret."""
    group = parser.add_argument_group("settings (each also an environment variable; docs/configuration.md)")
    for f in fields(Settings):
        flag = "--" + f.name.replace("_", "-")
        kind: Any = int if isinstance(f.default, int) and not isinstance(f.default, bool) else str
        described = f"{variable(f)}: {f.metadata['doc']}".replace("%", "%%")  # argparse formats help with %
        group.add_argument(flag, dest=f.name, type=kind, default=None, help=described)


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {f.name: getattr(args, f.name, None) for f in fields(Settings)}
    return Settings.from_env(**overrides)


def _exit_quietly(signum: int, frame: object) -> None:
    raise SystemExit(0)


# HTTP servers `serve` can run that come with an extra of the same name (the default, ledger, is ours)
OPTIONAL_SERVERS = ("granian", "uvicorn")


def serve(args: argparse.Namespace, settings: Settings) -> int:
    """Serve the HTTP API (embedded PostgreSQL when no database URL is set)."""
    from effect_ledger.db.receipt_log import own_log_process
    from effect_ledger.http.metrics import prepare_multiprocess_dir
    from effect_ledger.logs import configure_logging
    from effect_ledger.runtime import (
        database,
        export_settings,
        shared_rate_limits,
        with_jwt_secret,
        with_state_key,
    )

    configure_logging(settings.log_level, settings.log_format)
    if settings.http_server in OPTIONAL_SERVERS and importlib.util.find_spec(settings.http_server) is None:
        print(
            f"effect-ledger serve: EFFECT_LEDGER_HTTP_SERVER={settings.http_server} is not installed:"
            f" pip install 'effect-ledger[{settings.http_server}]', or leave the default (ledger)",
            file=sys.stderr,
        )
        return 2
    configured = settings
    settings = with_state_key(with_jwt_secret(settings))
    # uvicorn shuts down gracefully on SIGTERM/SIGINT, then re-raises the signal; turning that into a
    # normal exit lets the `with` below stop the embedded PostgreSQL and the process exit 0.
    signal.signal(signal.SIGTERM, _exit_quietly)
    signal.signal(signal.SIGINT, _exit_quietly)
    with (
        database(settings, run_migrations=not settings.database_url) as migrated,
        shared_rate_limits(migrated) as ready,
    ):  # one bucket file for every worker
        export_settings(ready)
        # workers (and the log process) share counts through it
        metrics_dir = prepare_multiprocess_dir(ready.workers + (1 if own_log_process(ready) else 0))
        _announce(configured, ready)
        try:
            if ready.http_server == "granian":
                _serve_granian(ready)
            elif ready.http_server == "ledger":
                from effect_ledger.http.prefork import serve as serve_ledger

                return serve_ledger(ready)  # docs/performance.md, "Issue 20 item 3, round 4"
            else:
                import uvicorn  # the extra effect-ledger[uvicorn]; the default server is our own (ledger)

                uvicorn.run(
                    "effect_ledger.http.app:app_from_env",
                    factory=True,
                    host=ready.host,
                    port=ready.port,
                    workers=ready.workers if ready.workers > 1 else None,
                    log_level="warning",
                    log_config=None,  # uvicorn's records go through the JSON handler of configure_logging
                    access_log=False,  # the app logs one summary line per request itself
                    timeout_graceful_shutdown=ready.shutdown_timeout_seconds,
                    lifespan="on",
                )
        finally:
            if metrics_dir is not None:
                shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0


def _announce(configured: Settings, ready: Settings) -> None:
    """The one start-up line: version, URL, docs URL, database (never a password), workers."""
    import structlog

    from effect_ledger import __version__
    from effect_ledger.logs import for_people

    url = f"http://{ready.host}:{ready.port}"
    if configured.database_url:
        database = f"PostgreSQL at {server_of(configured.database_url)}"
    else:
        database = f"embedded PostgreSQL in {configured.data_path}"
    workers = f"{ready.workers} worker" + ("s" if ready.workers > 1 else "")
    if for_people(ready.log_format):
        print(
            f"effect-ledger {__version__} on {url} (API docs: {url}/schema), {database}, {workers}",
            flush=True,
        )
    else:
        structlog.get_logger("effect_ledger").info(
            "serving",
            version=__version__,
            url=url,
            docs=f"{url}/schema",
            database=database,
            workers=ready.workers,
        )


def server_of(database_url: str) -> str:
    """A database URL without its password or options: scheme://user@host:port[,host:port]/database."""
    from urllib.parse import urlsplit

    parts = urlsplit(database_url)
    credentials, _, listed = parts.netloc.rpartition("@")
    user = credentials.partition(":")[0]
    return f"{parts.scheme}://{user + '@' if user else ''}{listed or 'localhost'}{parts.path}"


def _serve_granian(ready: Settings) -> None:
    """The same app under granian (a Rust HTTP server): workers are processes, lifespan on (under RSGI
    too: http.rsgi runs it in each worker's init and del)."""
    from granian import Granian
    from granian.constants import Interfaces

    from effect_ledger.http.metrics import choose_value_class

    # granian forks its workers from this process, which imported prometheus_client before
    # prepare_multiprocess_dir set its directory: choose the per-process value files now.
    choose_value_class()
    rsgi = ready.granian_interface == "rsgi"  # docs/performance.md, "Issue 20 item 3: the RSGI entry"
    Granian(
        "effect_ledger.http.rsgi:rsgi_app_from_env"
        if rsgi
        else "effect_ledger.http.linger:granian_asgi_app_from_env",
        factory=True,
        address=ready.host,
        port=ready.port,
        interface=Interfaces.RSGI if rsgi else Interfaces.ASGI,
        workers=ready.workers,
        log_enabled=False,  # the app logs one summary line per request itself, as JSON
        workers_kill_timeout=ready.shutdown_timeout_seconds,
    ).serve()


def migrate_command(args: argparse.Namespace, settings: Settings) -> int:
    """Migrate the configured database (or the embedded one) to the newest schema."""
    from effect_ledger.runtime import database

    with database(settings, run_migrations=True):
        print("migrated to head")
    return 0


def token_command(args: argparse.Namespace, settings: Settings) -> int:
    """Print a development token signed with the configured (or development) HS256 secret."""
    from effect_ledger.http.auth import mint_token
    from effect_ledger.runtime import with_jwt_secret

    settings = with_jwt_secret(settings)
    if settings.jwt_algorithm != "HS256" or not settings.jwt_secret:
        print("effect-ledger token mints HS256 tokens only", file=sys.stderr)
        return 2
    print(mint_token(settings.jwt_secret, args.tenant, args.sub, args.scope, settings, args.ttl))
    return 0


def config_command(args: argparse.Namespace, settings: Settings) -> int:
    """Print each setting as VARIABLE=value, secrets and URL passwords hidden."""
    from effect_ledger.settings import shown_value

    for f in fields(Settings):
        print(f"{variable(f)}={shown_value(f.name, getattr(settings, f.name))}")
    return 0


def token_flags(parser: argparse.ArgumentParser) -> None:
    """`effect-ledger token`'s own flags."""
    parser.add_argument("--tenant", required=True, help="the tenant claim (tid)")
    parser.add_argument("--sub", required=True, help="the principal (sub)")
    parser.add_argument("--scope", default="ledger:execute", help="space-separated scopes")
    parser.add_argument("--ttl", type=int, default=3600, help="lifetime in seconds")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand of COMMANDS."""
    parser = argparse.ArgumentParser(
        prog="effect-ledger", description="A ledger that makes side effects of agents and tools retry-safe."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, entry in COMMANDS.items():
        command = sub.add_parser(
            name, help=entry.help, description=entry.help[0].upper() + entry.help[1:] + "."
        )
        if entry.setting_flags:
            _add_setting_flags(command)
        if entry.flags is not None:
            try:
                _load(entry.flags)(command)
            except ModuleNotFoundError:
                pass  # an optional part that is not installed; running it says how to install it
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command named on the command line."""
    args = build_parser().parse_args(argv)
    entry = COMMANDS[args.command]
    try:
        handler: Handler = _load(entry.handler)
    except ModuleNotFoundError as missing:
        if entry.install is None:
            raise
        print(f"effect-ledger {args.command} needs {missing.name}: {entry.install}", file=sys.stderr)
        return 2
    try:
        settings = _settings(args)
    except SettingsError as bad:
        print("effect-ledger: invalid configuration (see docs/configuration.md):", file=sys.stderr)
        for problem in bad.problems:
            print(f"  {problem}", file=sys.stderr)
        return 2
    from effect_ledger.db.embedded import EmbeddedMissing

    try:
        return handler(args, settings)
    except EmbeddedMissing as missing:
        print(f"effect-ledger {args.command}: {missing}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
