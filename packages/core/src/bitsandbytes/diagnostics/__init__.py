"""``python -m bitsandbytes``: versions, backend status, op coverage and a self-test."""
