"""The papers' experiments, behind ``fedgrove reproduce``."""
