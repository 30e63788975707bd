"""effect-ledger: safe retries for side effects."""

__version__ = "0.1.0"
