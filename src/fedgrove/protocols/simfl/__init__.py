"""SimFL (horizontal): parties find similar instances across parties with p-stable LSH
(:mod:`~fedgrove.protocols.simfl.lsh`, once, saved), then each grows its trees on its
own data with gradients weighted by the other parties' aggregated ones."""
