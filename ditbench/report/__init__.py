"""Reports, claims and regression gates over result records (results.jsonl).

load          results.jsonl -> one pandas row per record (flattened config.*, metrics.*, env.*)
cells         a record's knobs; cells that differ only in given knobs
memory        card budgets, emulated cards, the memory that decides fit
timing        time to N steps, GPU-hours per million images
analysis      baseline comparison, the fastest cell that fits
advice        six sayings of common advice, checked
claims        claims files (YAML) and their validation; claim_values + claim_check give verdicts
claim_predict, advice_predict   `report --predict`: the planner's verdicts where nothing was measured
figures, speed_memory, plots   the PNG figures
blocks, sections, render       report.md, report.html and results.csv
cli           `ditbench report`
compare       the regression gate between two runs (`ditbench compare`)
"""
