"""fedgrove: federated tree learning.

Gradient-boosted trees and random forests trained by several organisations
whose data cannot leave their premises, split by samples (horizontal), by
features (vertical) or both (hybrid).

The centralised engine (:mod:`fedgrove.engine`) is at once the ALL-IN / SOLO
baseline and the oracle that lossless federated protocols reproduce exactly.
"""

from fedgrove._version import __version__
from fedgrove.exceptions import FedgroveError

__all__ = ["__version__", "FedgroveError"]
