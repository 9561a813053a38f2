"""Reports and regression gates over result records (results.jsonl).

load      results.jsonl -> one pandas row per record (flattened config.*, metrics.*, env.*)
analysis  baseline comparison, recommendations, checks of common advice
plots     throughput, memory and smoke-loss figures as PNG bytes
render    report.md, a self-contained report.html and results.csv
compare   the regression gate between two runs (`ditbench compare`)
"""
