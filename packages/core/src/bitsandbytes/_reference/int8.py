"""Reference kernels (placeholder: being written)."""
