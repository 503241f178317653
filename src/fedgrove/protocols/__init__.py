"""Federated protocols: one folder per protocol, ``messages.py`` plus one file per role.

Protocols import the engine, the Channel API and crypto, never a concrete
transport, so the same role code runs in-process and over gRPC.
"""

from fedgrove.exceptions import InvalidParameterError


def refuse_unsupported(params, protocol: str) -> None:
    """Refuse, by name, the boosting settings a federated protocol does not implement and would otherwise ignore:
    row/column subsampling, and early stopping (a federation trains without a validation set)."""
    if params.subsample < 1 or params.colsample_bytree < 1:
        raise InvalidParameterError(f"row/column subsampling is not supported by {protocol} (subsample="
                                    f"{params.subsample}, colsample_bytree={params.colsample_bytree}; use 1)")
    if params.early_stopping_rounds:
        raise InvalidParameterError(f"early stopping is not supported by {protocol}: a federation trains without a "
                                    f"validation set (early_stopping_rounds={params.early_stopping_rounds}; "
                                    f"remove it)")
