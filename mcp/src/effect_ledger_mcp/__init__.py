"""effect-ledger-mcp: an MCP gateway that runs every consequential tools/call through effect-ledger.

A retried call (by the model, the host or after a crash) runs the upstream tool at most once, and an
uncertain outcome is reported as unknown instead of being repeated (docs/mcp.md, API.md section 16).
"""

__version__ = "0.1.0"
