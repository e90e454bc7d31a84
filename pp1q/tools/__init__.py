"""Tools built on the library and the daemons: replay, chaos and soak, benchmarks, the
HTTP client and the accepted-length theory."""
