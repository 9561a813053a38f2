"""The regression gate: compare a new run with a baseline run, cell by cell (`ditbench compare`);
docs/architecture.md's code map says what each module does."""
