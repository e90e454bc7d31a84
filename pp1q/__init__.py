"""pp1q: exact draft-distribution transport for remote speculative sampling."""

__version__ = "0.1.0"
