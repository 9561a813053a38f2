"""Sample-quality metrics in the ADM convention: FID, sFID, Inception Score, precision/recall, KID."""
