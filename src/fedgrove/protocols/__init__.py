"""Federated protocols: one folder per protocol, ``messages.py`` plus one file per role.

Protocols import the engine, the Channel API and crypto, never a concrete
transport, so the same role code runs in-process and over gRPC.
"""
