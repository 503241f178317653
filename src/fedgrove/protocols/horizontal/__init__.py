"""Horizontal histogram aggregation with secure aggregation: clients hold different
samples of the same features; an aggregator learns only the sums of their
histograms and chooses the splits.  Lossless: with the common cut points it
grows exactly the centralised engine's trees on the union of the data."""
