"""Pure rules of the ledger: no I/O."""
