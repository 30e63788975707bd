"""One entry point: serve, migrate, token (and the commands the other modules add)."""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any

from effect_ledger.settings import Settings

Command = Callable[[argparse.Namespace, Settings], int]
COMMANDS: dict[str, Command] = {}


def command(name: str) -> Callable[[Command], Command]:
    """Register a subcommand."""

    def register(fn: Command) -> Command:
        COMMANDS[name] = fn
        return fn

    return register


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """Every setting as a flag named like its variable: EFFECT_LEDGER_JWT_SECRET <-> --jwt-secret."""
    for f in fields(Settings):
        flag = "--" + f.name.replace("_", "-")
        default = Settings.__dataclass_fields__[f.name].default
        kind: Any = int if isinstance(default, int) and not isinstance(default, bool) else str
        variable = f"EFFECT_LEDGER_{f.name.upper()}"
        parser.add_argument(flag, dest=f.name, type=kind, default=None, help=variable)


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {f.name: getattr(args, f.name, None) for f in fields(Settings)}
    sweep = overrides.get("background_sweep")
    if isinstance(sweep, str):
        overrides["background_sweep"] = sweep.lower() in ("1", "true", "yes", "on")
    return Settings.from_env(**overrides)


def _exit_quietly(signum: int, frame: object) -> None:
    raise SystemExit(0)


@command("serve")
def serve(args: argparse.Namespace, settings: Settings) -> int:
    """Serve the HTTP API (embedded PostgreSQL when no database URL is set)."""
    import uvicorn

    from effect_ledger.http.metrics import prepare_multiprocess_dir
    from effect_ledger.logs import configure_logging
    from effect_ledger.runtime import database, export_settings, with_jwt_secret

    configure_logging(settings.log_level)
    settings = with_jwt_secret(settings)
    # uvicorn shuts down gracefully on SIGTERM/SIGINT, then re-raises the signal; turning that into a
    # normal exit lets the `with` below stop the embedded PostgreSQL and the process exit 0.
    signal.signal(signal.SIGTERM, _exit_quietly)
    signal.signal(signal.SIGINT, _exit_quietly)
    with database(settings, run_migrations=not settings.database_url) as ready:
        export_settings(ready)
        metrics_dir = prepare_multiprocess_dir(ready.workers)  # workers share counts through it
        try:
            if ready.http_server == "granian":
                _serve_granian(ready)
            else:
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


def _serve_granian(ready: Settings) -> None:
    """The same app under granian (a Rust HTTP server): workers are processes, lifespan on."""
    from granian import Granian
    from granian.constants import Interfaces

    Granian(
        "effect_ledger.http.app:app_from_env",
        factory=True,
        address=ready.host,
        port=ready.port,
        interface=Interfaces.ASGI,
        workers=ready.workers,
        log_enabled=False,  # the app logs one summary line per request itself, as JSON
        workers_kill_timeout=ready.shutdown_timeout_seconds,
    ).serve()


@command("migrate")
def migrate_command(args: argparse.Namespace, settings: Settings) -> int:
    """Migrate the configured database (or the embedded one) to the newest schema."""
    from effect_ledger.runtime import database

    with database(settings, run_migrations=True):
        print("migrated to head")
    return 0


@command("token")
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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="effect-ledger", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("serve", "migrate", "sweep", "purge"):
        _add_setting_flags(sub.add_parser(name, help=name))
    _add_setting_flags(sub.add_parser("demo", help="run the reference scenario end to end (0: all held)"))
    token = sub.add_parser("token", help="mint a development token")
    _add_setting_flags(token)
    token.add_argument("--tenant", required=True)
    token.add_argument("--sub", required=True)
    token.add_argument("--scope", default="ledger:execute")
    token.add_argument("--ttl", type=int, default=3600, help="lifetime in seconds")
    schema = sub.add_parser("schema", help="regenerate schema/ledger.sql and schema/openapi.json")
    schema.add_argument("--check", action="store_true", help="only report stale files (exit 1)")
    bench = sub.add_parser("bench", help="measure effect cycles against the PostgreSQL limit")
    bench_module = _bench_module()
    if bench_module is not None:
        bench_module.add_bench_flags(bench)
    return parser


def _bench_module() -> Any:
    """The bench's command module, imported by name: the bench lives outside the product's packages."""
    import importlib

    try:
        return importlib.import_module("effect_ledger_bench.command")
    except ModuleNotFoundError:
        return None


@command("bench")
def bench_command(args: argparse.Namespace, settings: Settings) -> int:
    """Run the bench (package effect_ledger_bench, extra [bench]), or say how to install it."""
    bench_module = _bench_module()
    if bench_module is None:
        print("effect-ledger bench is not installed: pip install 'effect-ledger[bench]'", file=sys.stderr)
        return 2
    return int(bench_module.bench_command(args, settings))


def _register_commands() -> None:
    """Import the modules whose @command functions live outside this file."""
    import importlib

    modules = ("effect_ledger.schema_cli", "effect_ledger.maintenance_cli", "effect_ledger.demo.command")
    for module in modules:
        importlib.import_module(module)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command named on the command line."""
    _register_commands()
    args = build_parser().parse_args(argv)
    handler = COMMANDS.get(args.command)
    if handler is None:
        print(f"effect-ledger {args.command}: not available in this build", file=sys.stderr)
        return 2
    return handler(args, _settings(args))


if __name__ == "__main__":
    # Under `python -m`, this file is __main__ while command modules register in effect_ledger.cli.
    from effect_ledger.cli import main as registered_main

    sys.exit(registered_main())
