"""Writes the seed corpus (ci/fuzz/corpus/<target>/seed-*) from real outputs of the package, so the
fuzzers start from valid inputs. Deterministic; rerun after changing a harness' input layout. Inputs that
once found a bug are kept next to them as regression-* files (never rewritten here)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))


def quant_states() -> dict[str, dict]:
    import bitsandbytes.functional as F

    torch.manual_seed(0)
    w = torch.randn(8, 24, dtype=torch.float16)
    out = {}
    for qt in ("nf4", "fp4"):
        for nested in (False, True):
            _, qs = F.quantize_4bit(w, blocksize=64, quant_type=qt, compress_statistics=nested)
            out[f"{qt}{'-nested' if nested else ''}"] = qs.as_dict(packed=True)
    return out


def seeds() -> dict[str, dict[str, bytes]]:
    from _quant_items import PREFIXES, encode_seed

    states = quant_states()
    out: dict[str, dict[str, bytes]] = {"quant_state": {}, "unpack_tensor_to_dict": {}, "linear4bit_state": {}}
    for name, d in states.items():
        out["quant_state"][name] = bytes([PREFIXES.index("weight.")]) + encode_seed(d)
        blob = next(v for k, v in d.items() if k.startswith("quant_state."))
        out["unpack_tensor_to_dict"][name] = bytes(blob.tolist())
        # Linear4bit(24, 8), no bias; the weight: uint8, its exact size, [bytes, 1]; strict, no assign; x: two
        # rows of a seeded normal sample.
        out["linear4bit_state"][name] = bytes([24, 8, 0, 0, 0, 0, 1, 0, 1, 7, 0, 0, 1]) + encode_seed(d)
    # The packed weight as [1, bytes] (upstream's transposed layout), with a bias.
    d = states["nf4"]
    out["linear4bit_state"]["nf4-row-layout-bias"] = bytes([24, 8, 1, 0, 0, 1, 1, 0, 1, 7, 0, 0, 1]) + encode_seed(d)
    # The other targets decode any bytes into a call; a few fixed patterns give each a start.
    patterns = {"zeros": bytes(64), "ones": bytes([1]) * 64, "mixed": bytes(range(0, 256, 3)), "high": b"\xff" * 64}
    for target in ("optimizer_state", "linear8bit_state", "native_blockwise", "native_fourbit", "native_int8",
                   "native_matmul_4bit", "native_optimizers"):  # fmt: skip
        out[target] = dict(patterns)
    # Linear8bitLt(16, 8) without fp16 weights: int8 weight [8, 16] of seeded values, float32 SCB [8].
    out["linear8bit_state"]["int8-row"] = bytes([16, 8, 0, 0, 0, 1, 0, 0, 1, 7, 0, 0, 1, 0, 0, 1, 9, 0, 0, 1, 0])
    return out


def main() -> None:
    for target, files in seeds().items():
        folder = HERE / "corpus" / target
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("seed-*"):
            old.unlink()
        for name, data in files.items():
            (folder / f"seed-{name}").write_bytes(data)
        print(f"{target}: {len(files)} seeds")


if __name__ == "__main__":
    main()
