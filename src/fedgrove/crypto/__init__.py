"""Cryptography: additively homomorphic encryption (HEU fast backend, fedgrove's own
Okamoto-Uchiyama on gmpy2 where HEU is not installed, python-paillier reference
backend), the fixed-point packing codec, secure aggregation and
differential-privacy primitives."""

from fedgrove.crypto.he import HEContext, available_backends, keygen
from fedgrove.crypto.packing import GHPacker

__all__ = ["HEContext", "GHPacker", "keygen", "available_backends"]
