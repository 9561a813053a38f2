"""Reports, claims and the regression gate over result records (results.jsonl); docs/architecture.md's
code map says what each module does."""
