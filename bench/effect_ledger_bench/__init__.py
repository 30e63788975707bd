"""`effect-ledger bench`: the service's effect-cycle throughput against the PostgreSQL limit under it."""
