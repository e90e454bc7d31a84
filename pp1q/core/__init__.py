"""The exact distribution core: dyadic q rows, keyed Philox draws, prefixes, standard
verification, the rational oracle, depth admission and the closed error set.

Nothing here knows the wire, the daemons or a device: pure functions and small value
types that the wire, the worker, the verifier and the tools build on.
"""
