"""effect-ledger-mcp: `serve --config FILE [--transport stdio|http] [--host H --port N]` and `tools`."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

import anyio

from effect_ledger_mcp.config import STATUS_TOOL, Config, ConfigError, load_config
from effect_ledger_mcp.serve import serve
from effect_ledger_mcp.upstreams import open_upstreams


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="effect-ledger-mcp", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("serve", help="serve the gateway to an MCP host")
    run.add_argument("--config", required=True, help="the gateway's JSON configuration file")
    run.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    run.add_argument("--host", default="127.0.0.1", help="HTTP transport: the address to listen on")
    run.add_argument(
        "--port", type=int, default=8765, help="HTTP transport: the port (streamable HTTP at /mcp)"
    )
    tools = commands.add_parser("tools", help="print every upstream tool with its policy decision")
    tools.add_argument("--config", required=True)
    return parser


async def print_tools(config: Config) -> None:
    """One line per upstream tool: exposed name, mode, and what the rule adds."""
    async with open_upstreams(config) as upstreams:
        for server in upstreams.values():
            for tool in server.tools:
                name = f"{server.name}__{tool.name}"
                decision = config.decide(name)
                details = []
                if decision.mode == "wrap":
                    details.append(f"timeout={decision.timeout_seconds:g}s")
                    details.append(f"on_tool_error={decision.on_tool_error}")
                    if decision.volatile:
                        details.append("volatile=" + ",".join(sorted(decision.volatile)))
                    if decision.inject:
                        details.append("inject=" + ",".join(sorted(decision.inject)))
                details.append(f"rule={decision.rule or 'default'}")
                print(f"{name}\t{decision.mode}\t{' '.join(details)}")
    print(f"{STATUS_TOOL}\tread-only\tthe ledger's view of one operation")


def main(argv: Sequence[str] | None = None) -> int:
    """The console script."""
    args = _parser().parse_args(argv)
    # stdout is the MCP channel over stdio: every log line goes to stderr.
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"effect-ledger-mcp: invalid configuration: {exc}", file=sys.stderr)
        return 2
    if args.command == "tools":
        anyio.run(print_tools, config)
        return 0
    try:
        anyio.run(serve, config, args.transport, args.host, args.port)
    except KeyboardInterrupt:
        return 0
    return 0
