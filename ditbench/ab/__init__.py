"""`ditbench ab`: a regression gate that runs both sides itself, paired, until the answer is known.

sides.py (the two interpreters, checked), rounds.py (each round's processes, interleaved or duet),
sequential.py (the gate after every round: report.gate with the paired timing of
report.gate.paired), cli.py (the command).
"""
