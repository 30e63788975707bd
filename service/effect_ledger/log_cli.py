"""The receipts log's commands (API.md section 14): `log-signer`, `log-key`, `witness`, `log-recover`."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from effect_ledger.settings import Settings


def signer_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen-host", dest="signer_host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--listen-port", dest="signer_port", type=int, default=7380, help="port to listen on")
    parser.add_argument("--key", dest="key_file", help="the Ed25519 key file (LOG_SIGNER_KEY)")
    parser.add_argument("--state", dest="state_dir", help="the signer's state directory (LOG_SIGNER_STATE)")
    parser.add_argument(
        "--token-file",
        dest="signer_token_file",
        help="the secret shared with the service (LOG_SIGNER_TOKEN_FILE); needed to listen beyond loopback",
    )
    parser.add_argument("--generate-key", action="store_true", help="create the key file if absent")
    parser.add_argument("--init", action="store_true", help="only create the key file (if absent), then exit")
    parser.add_argument(
        "--accept-loss", metavar="ORIGIN", help="an operator's decision: ORIGIN continues from --size/--root"
    )
    parser.add_argument("--size", type=int, help="with --accept-loss: the database's log size")
    parser.add_argument("--root", help="with --accept-loss: the database's log root (base64)")


def signer_command(args: argparse.Namespace, settings: Settings) -> int:
    """Serve the signer on a local address: the key and the state stay on this host, never in the
    database. It signs a checkpoint only with a valid consistency proof from its last signed one."""
    from effect_ledger.domain.note import unb64
    from effect_ledger.settings import read_token
    from effect_ledger.signer import FileSigner, create_key, key_path, serve_signer, state_path

    key = Path(args.key_file) if args.key_file else key_path(settings)
    state = Path(args.state_dir) if args.state_dir else state_path(settings)
    if args.generate_key or args.init:
        create_key(key, settings.log_origin)
    if args.init:
        print(json.dumps({"key": str(key)}))
        return 0
    if not key.is_file():
        print(f"log-signer: no key file at {key} (--generate-key creates one)", file=sys.stderr)
        return 2
    signer = FileSigner(key, state)
    if args.accept_loss:
        if args.size is None or args.root is None:
            print("log-signer: --accept-loss needs --size and --root", file=sys.stderr)
            return 2
        signer.accept_loss(args.accept_loss, args.size, unb64(args.root))
        print(json.dumps({"accepted_loss": args.accept_loss, "size": args.size}))
        return 0
    token_file = args.signer_token_file or settings.log_signer_token_file
    try:
        token = read_token(token_file) if token_file else None
        server = serve_signer(signer, args.signer_host, args.signer_port, token)
    except (OSError, ValueError) as refused:
        print(f"log-signer: {refused}", file=sys.stderr)
        return 2
    print(
        json.dumps({"log_signer": f"http://{args.signer_host}:{server.server_port}", "prefix": signer.prefix})
    )
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def key_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tenant", required=True, help="the tenant whose log key to print")


def key_command(args: argparse.Namespace, settings: Settings) -> int:
    """Print a tenant's log origin, verifier key, witnesses and quorum (what auditors pin)."""
    from effect_ledger.db.receipt_log import witness_config
    from effect_ledger.domain.receipt_log import origin_of
    from effect_ledger.signer import signer_from_settings

    origin = origin_of(settings.log_origin, args.tenant)
    vkey = asyncio.run(signer_from_settings(settings).vkey(origin))
    witnesses = witness_config(settings)
    body = {
        "origin": origin,
        "vkey": vkey,
        "witnesses": [{"name": w.name, "vkey": w.vkey} for w in witnesses.items],
        "quorum": witnesses.quorum,
    }
    print(json.dumps(body))
    return 0


def witness_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", dest="witness_host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", dest="witness_port", type=int, required=True, help="port to listen on")
    parser.add_argument("--state", dest="witness_state", required=True, help="directory of its state")
    parser.add_argument("--key", dest="witness_key", required=True, help="its cosigner key file (created)")
    parser.add_argument("--name", dest="witness_name", default="witness.local", help="its name (new key)")
    parser.add_argument("--log", dest="witness_logs", nargs="+", required=True, help="vkeys of the logs")


def witness_command(args: argparse.Namespace, settings: Settings) -> int:
    """A complete small c2sp.org/tlog-witness: add-checkpoint with persisted state."""
    from effect_ledger.witness import load_or_create_key, make_witness

    key = load_or_create_key(Path(args.witness_key), args.witness_name)
    server = make_witness(
        Path(args.witness_state), key, args.witness_logs, args.witness_host, args.witness_port
    )
    print(
        json.dumps({"witness": f"http://{args.witness_host}:{server.server_port}", "vkey": key.verifier.vkey})
    )
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def recover_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tenant", help="the tenant to recover (default: every tenant behind the signer)")
    parser.add_argument("--entries", help="directory of mirrored entry bundles (DIR/tile/entries/...)")
    parser.add_argument("--accept-loss", action="store_true", help="record accepting the loss instead")
    parser.add_argument("--reason", help="with --accept-loss: why (recorded and logged)")


def recover_command(args: argparse.Namespace, settings: Settings) -> int:
    """Bring the database's logs back to what the signer signed (from mirrored entry bundles), or
    record an operator's decision to accept the loss."""
    if bool(args.entries) == bool(args.accept_loss):
        print("log-recover: give exactly one of --entries DIR and --accept-loss --reason …", file=sys.stderr)
        return 2
    if args.accept_loss and not args.reason:
        print("log-recover: --accept-loss needs --reason", file=sys.stderr)
        return 2
    from effect_ledger.logs import configure_logging
    from effect_ledger.runtime import database

    configure_logging(settings.log_level, settings.log_format)
    with database(settings, run_migrations=not settings.database_url) as ready:
        try:
            report = asyncio.run(_recover(args, ready))
        except Exception as exc:
            from effect_ledger.db.receipt_log import RecoveryError
            from effect_ledger.signer import SignRefused

            # a remote signer refuses to record a loss itself (it is decided on the signer's host,
            # `log-signer --accept-loss`): said as a refusal with its reason, not a traceback (round 36)
            if isinstance(exc, RecoveryError | SignRefused):
                print(json.dumps({"log_recover": "refused", "reason": str(exc)}), file=sys.stderr)
                return 1
            raise
    print(json.dumps(report))
    return 0


async def _recover(args: argparse.Namespace, settings: Settings) -> dict[str, object]:
    from effect_ledger.db import receipt_log as repo
    from effect_ledger.db.maintenance import owner_connection
    from effect_ledger.domain.receipt_log import origin_of
    from effect_ledger.signer import signer_from_settings

    signer = signer_from_settings(settings)
    conn = await owner_connection(settings)
    try:
        states = await signer.states()
        _, behind = await repo.behind_signer(conn, states, settings.log_origin)
        tenants = [args.tenant] if args.tenant else sorted(behind)
        done: dict[str, object] = {}
        for tenant in tenants:
            if tenant not in behind:
                done[tenant] = "not behind"
                continue
            if args.accept_loss:
                lost = await repo.accept_loss(conn, signer, settings.log_origin, tenant, args.reason)
                done[tenant] = {"accepted_loss": lost}
                continue
            origin = origin_of(settings.log_origin, tenant)
            signed = states[origin]
            mirror = repo.read_mirror(Path(args.entries), signed.size)
            done[tenant] = await repo.recover_tenant(conn, tenant, signed, mirror, settings.log_origin)
        return {"log_recover": done}
    finally:
        await conn.close()
