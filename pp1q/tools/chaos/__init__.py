"""Fault injection between the daemons: the proxy, the chaos matrix and the soak."""
