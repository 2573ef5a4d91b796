"""Checkpoint interchange with upstream bitsandbytes: the cases, and the scripts that write and check them."""
