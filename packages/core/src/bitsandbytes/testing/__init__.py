"""The conformance suite: proves that a device's kernels agree with the reference kernels.

Run it against one device with ``python -m bitsandbytes.testing --device cuda`` (or
``pytest --pyargs bitsandbytes.testing --bnb-device cuda``); a device missing here is a skip that
names it. Reusable pieces for a backend's own tests: ``cases`` (inputs), ``compare`` (comparisons
that report the first mismatch), ``samples`` (representative arguments for every op, e.g. for
``torch.library.opcheck``), ``bad_inputs`` (the bad-input matrix: bad calls and what each must do, with
helpers to run them on a backend's functions). What is compared how is described in
``conformance/__init__.py``; ``--bnb-bitexact`` makes the optimizer edge cases compare states bit for bit.
"""
