"""Sample-quality metrics in the ADM convention: FID, sFID, Inception Score, precision/recall, KID.

`evaluate.Scorer` is the library entry point, `cli` is `ditbench fid`; `registry` lists every metric,
each its own module declaring a `spec.Metric`.
"""
