"""The verifier as a rank group (``pp1q verifier --ranks N``): rank 0's ranked decider
(group.py), followers (follower.py), op bytes (ops.py), the replica every rank keeps
(replica.py), collectives (collective.py) and launching (launch.py)."""
