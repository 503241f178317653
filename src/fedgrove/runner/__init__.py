"""Running federations from configuration files: ``fedgrove simulate`` (all parties
in one process) and ``fedgrove party`` (one party per process, gRPC + mutual TLS).
Both run the same role code on a Channel."""
