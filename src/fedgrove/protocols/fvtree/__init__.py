"""FV-tree and FGBDT-Chain (horizontal): parties vote on features per node, then sum
their histograms for the top candidates; optional differential privacy; split-Shapley
contributions recorded on a signed SQLite ledger (:mod:`fedgrove.ledger`)."""
