"""HybridTree (hybrid data: a host with labels and all instances, guests with other
features for subsets): the host grows the top layers, each guest appends bottom
layers on encrypted gradients.  Built: training in hessian mode and two-round
inference; not yet: count mode, multi-host bagging and the paper's experiments
(see docs/protocols.md)."""
