"""The `unwind` command (also installed as `kubectl-unwind`)."""
