"""`python -m effect_ledger_mcp` is `effect-ledger-mcp`."""

from effect_ledger_mcp.cli import main

raise SystemExit(main())
