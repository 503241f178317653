"""FGBDT-Chain's tamper-evident ledger: an append-only log of signed, hash-chained
records in a SQLite file, split-Shapley contribution accounting, and verification."""
