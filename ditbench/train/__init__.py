"""Training: the Trainer (step.py), AdamW and the EMA (optim.py), the data sources (data.py)."""
