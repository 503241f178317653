"""Node-level vertical GBDT (SecureBoost-style): an active party with labels and
features, passive parties with features of the same instances.  Lossless: with
the same cut points it grows exactly the centralised engine's trees."""

from fedgrove.protocols.vertical.active import VerticalActive
from fedgrove.protocols.vertical.passive import VerticalPassive

__all__ = ["VerticalActive", "VerticalPassive"]
