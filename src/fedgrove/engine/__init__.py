"""The centralised histogram tree engine: binning, numba kernels (with numpy
references), the layer-wise grower and its split finders, GBDT, random forest,
and models.  It imports nothing from transport, crypto or protocols."""
