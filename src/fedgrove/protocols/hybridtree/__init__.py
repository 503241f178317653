"""HybridTree (hybrid data: a host with labels and all instances, guests with other
features for subsets): the host grows the top layers, each guest appends bottom
layers on encrypted gradients, in hessian mode (default) or the paper's count
mode; two-round inference from per-party model files; several hosts' federations
bagged by :mod:`~fedgrove.protocols.hybridtree.bagging`.  The paper's experiments:
:mod:`fedgrove.experiments.hybridtree` (see docs/protocols.md)."""
