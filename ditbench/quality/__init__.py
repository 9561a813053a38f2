"""The quality loop: sample-quality metrics (FID, sFID, IS, precision/recall, KID) for trained cells.

spec (the suite's `quality:` section, validated, and which cells it applies to), evaluation
(sample with the EMA weights, decode, score against the reference, mean and spread over seeds),
grid (the sample grid every cell shares noise and labels for), loop (the quality phase of a
cell: train to each evaluation step, timing training apart from sampling and scoring). The report's
quality section is `ditbench.report.quality`, the gate's `ditbench.report.gate.quality`.
"""
