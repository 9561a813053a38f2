"""The result record: its model (model.py), its metrics declared once (metrics.py), and results.jsonl,
where records are appended and read back (jsonl.py)."""
