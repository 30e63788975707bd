"""`effect-ledger demo`: the reference chapter's scenario, run end to end against a real ledger."""
