"""`ditbench ab`: a regression gate that runs both sides itself, paired, until the answer is known.
sides (the two interpreters), rounds (each round's processes), sequential (the gate after every round).
"""
