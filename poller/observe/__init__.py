"""What the poller tells operators: metrics, logs, and trace spans over OTLP."""
