"""What a running daemon needs around its protocol work: typed settings, Prometheus
metrics, mutual TLS, capture files and the launcher of child processes."""
