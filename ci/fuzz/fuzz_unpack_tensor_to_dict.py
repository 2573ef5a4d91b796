"""bitsandbytes.utils.unpack_tensor_to_dict on arbitrary bytes (the packed JSON of a QuantState).

Allowed: TypeError / ValueError naming ``tensor_data``. An accepted blob must be a dict that packs and
unpacks to the same JSON text.
"""

from __future__ import annotations

import json

import torch
from _harness import Finding, call, main


def test_one_input(data: bytes) -> None:
    from bitsandbytes.utils import pack_dict_to_tensor, unpack_tensor_to_dict

    t = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    ok, d = call(unpack_tensor_to_dict, t, names=["tensor_data"])
    if not ok:
        return
    if not isinstance(d, dict):
        raise Finding(f"unpack_tensor_to_dict returned {type(d).__name__}, not a dict")
    text = json.dumps(d)
    if json.dumps(unpack_tensor_to_dict(pack_dict_to_tensor(d))) != text:
        raise Finding("pack_dict_to_tensor / unpack_tensor_to_dict do not round-trip")


if __name__ == "__main__":
    main(test_one_input, ["bitsandbytes", "bitsandbytes.utils"])
