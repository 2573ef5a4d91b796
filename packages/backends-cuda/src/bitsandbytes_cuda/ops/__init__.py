"""Op implementations for device cuda (one module per family; each has register())."""
