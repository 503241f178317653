"""Property tests: many small random cases, each seed's drawn in one stream."""


def random_features(rs, n: int, d: int, missing: float):
    """``n`` x ``d`` random features of mixed scales (1e-3, 1, 1e4), in half the tables with missing values (up to
    a ``missing`` share), a few-valued first column in three tenths and a constant last one in a fifth."""
    import numpy as np

    X = rs.normal(size=(n, d)) * rs.choice([1e-3, 1, 1e4], size=d)
    if rs.random() < 0.5:
        X[rs.random(X.shape) < rs.random() * missing] = np.nan
    if rs.random() < 0.3:
        X[:, 0] = rs.integers(0, 3, n)
    if rs.random() < 0.2:
        X[:, -1] = 5.0
    return X
