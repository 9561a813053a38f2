"""`ditbench ab`: a regression gate that runs both sides itself, paired, until the answer is known."""
