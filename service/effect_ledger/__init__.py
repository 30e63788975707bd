"""effect-ledger: safe retries for side effects."""
