"""The verifier as a rank group (``pp1q verifier --ranks N``): rank 0's Decider
(decider.py) and its exchanges (group.py), followers (follower.py), op bytes (ops.py),
votes and verdicts (votes.py), the replica every rank keeps with its decisions
(replica.py), collectives (collective.py) and launching (launch.py)."""
