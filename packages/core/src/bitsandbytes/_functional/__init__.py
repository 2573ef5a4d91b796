"""Implementation modules of ``bitsandbytes.functional``, one per op family."""
