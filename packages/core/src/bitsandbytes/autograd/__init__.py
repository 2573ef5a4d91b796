"""Autograd functions for quantized matrix products."""
