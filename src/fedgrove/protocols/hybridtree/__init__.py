"""HybridTree (hybrid data: a host with labels and all instances, guests with other
features for subsets): the host grows the top layers, each guest appends bottom
layers on encrypted gradients.  Work in progress: training in hessian mode;
count mode, multi-host bagging, two-round inference and the paper's
experiments are not built yet (see docs/protocols.md)."""
