"""Conformance tests: each op on the device under test (``--bnb-device``) against the reference kernel.

Every test runs the op through the dispatcher, ``torch.ops.bitsandbytes.<op>``, on the device, so it
tests whatever kernel that device has (a backend's native one, or the reference as fallback), and
calls ``bitsandbytes._reference.REFERENCE[op]`` directly on CPU copies of the same inputs.

What must match how:

* bit-exact where the format defines the bytes: quantized codes, absmax, packed 4-bit bytes, int8
  codes, row/column stats, int32 matmul results, and the dequantized values of the 8-bit and 4-bit
  formats (each is one fp32 product ``code * absmax`` rounded once to the output dtype);
* a stated tolerance where float summation order is a kernel's free choice (the matmuls, the fused
  scale products of the int8 dequantizers, optimizer steps); each test module states its tolerances
  and why.

Because the reference run against itself would pass any comparison, each module also checks format
invariants that do not depend on the reference: absmax is the exact block maximum, every code is a
nearest code, all-zero blocks give zeros, packed sizes, int8 range, exact integer matmul, and the
NaN/Inf policy (a non-finite input makes its block's scale non-finite and the block dequantize to
non-finite values, never a crash).
"""
