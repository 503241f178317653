"""Federated Forest (vertical random forest): a master draws each tree and picks every
split from the clients' per-feature gains; each client keeps the thresholds of its own
splits; prediction in one round.  Equal, tree for tree, to the engine's centralised
forest on the clients' columns side by side."""
