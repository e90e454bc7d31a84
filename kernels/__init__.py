"""Tensor kernels for proposal and verification (installed as ``pp1q_kernels``).

Tensor functions only: no wire, no asyncio, no daemons.
"""
