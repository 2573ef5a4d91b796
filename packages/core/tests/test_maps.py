"""Code tables and map builders: values identical to upstream bitsandbytes 0.50.

The SHA-256 digests below are of the float32 bytes upstream 0.50.2 returns on CPU for the same calls
(recorded once from upstream; they pin every bit, including signed zeros).
"""

import hashlib
import math

import pytest
import torch

import bitsandbytes.functional as F
from bitsandbytes import _formats

# Upstream's NF4 literals, written out independently of bitsandbytes._formats.
NF4_UPSTREAM = [
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
]  # fmt: skip

UPSTREAM_DIGESTS = {
    "dynamic": ((), "e732639a65f497b4ad684bb166a4467708255edd5207757de8b8f0c7e1fda89c"),
    "dynamic_unsigned": ((False,), "305f002cc11278fb769d13b25b9fd0c7c83c8402c40a878fe086f4039fde6398"),
    "dynamic_e4": ((True, 4, 8), "658354198d3adf244013573955b15056452ce4e25239e5abd81bbc61aa856246"),
    "dynamic_e5": ((True, 5, 8), "3fca03bcfc9a67396ad557f94cf4b51049c6c13c27c327266527186e9ffe61cc"),
    "dynamic_6bit": ((True, 3, 6), "ef13578c9105a72393d37872179f43ce091d825c41f882fc3f9711fa4e8da796"),
}
LINEAR_DIGESTS = {
    (): "80bf4c55fa736fa18f611d26a59e99475bae78388280fbccbf4c7d12437a4775",
    (False,): "7cb9ea560989533d101f5082aa194366c6fd5d82a305f2994cc39312a65f7962",
    (True, 4): "796ada13e4d246a62e8136ba578f0599c645ed27ed8b568d72895158e24ddf6c",
    (True, 8, False): "d88eea2f793473b6ba77330cd7ce319ceb4f31aa83ccf5dda7e88b1564de56c1",
    (False, 3): "393cb0101cb04d4142c8df9b2bf188652846d8d68d510b93d2a175c6a4b93d31",
}
FP8_DIGESTS = {
    (): "0da7c4e2990b302a360d0664262e0bce8012809e65954885e9b573c00fd57b04",
    (True, 2, 1, 4): "d92a5fb4cd0a2592d326ccd5fea0da50c838bb7c6693c620816d5c92d4f89b81",
    (False, 4, 4, 8): "421a507fa7f195e5c6a76f3c82455a6dea96a2108c2a39f60e4df0ac1a347a13",
}
FOURBIT_DIGESTS = {
    "nf4": "8501941daa1b8a90ad1bbfeb632e5101b5dddbc4bb52d6e55abcfd777e60c06a",
    "fp4": "b830bcf8857895e5676b8e2ce608a60bb8af9b3ce6270073e9de34814196f09c",
    "af4": "d1b349d2eab5e29fc00ce3112fe7642fe378b9c497738e05a865e8d9bed9b520",
}


def digest(t: torch.Tensor) -> str:
    assert t.dtype == torch.float32
    return hashlib.sha256(bytes(t.contiguous().view(torch.uint8).tolist())).hexdigest()


@pytest.mark.parametrize("name", UPSTREAM_DIGESTS)
def test_dynamic_maps_match_upstream_bits(name):
    args, expected = UPSTREAM_DIGESTS[name]
    assert digest(F.create_dynamic_map(*args)) == expected


@pytest.mark.parametrize("args", LINEAR_DIGESTS)
def test_linear_maps_match_upstream_bits(args):
    assert digest(F.create_linear_map(*args)) == LINEAR_DIGESTS[args]


@pytest.mark.parametrize("args", FP8_DIGESTS)
def test_fp8_maps_match_upstream_bits(args):
    assert digest(F.create_fp8_map(*args)) == FP8_DIGESTS[args]


@pytest.mark.parametrize("typename", FOURBIT_DIGESTS)
def test_4bit_types_match_upstream_bits(typename):
    assert digest(F.get_4bit_type(typename, device="cpu")) == FOURBIT_DIGESTS[typename]


def test_signed_dynamic_map_facts():
    code = F.create_dynamic_map()
    assert code.shape == (256,) and code.dtype == torch.float32
    assert torch.all(code[1:] >= code[:-1])
    assert -1.0 not in code.tolist()
    assert code[127].item() == 0.0
    assert code[255].item() == 1.0
    # Smallest magnitude: 1e-6 times the midpoint of [0.1, 1]; largest below 1: 1 - 0.9 / 128.
    assert math.isclose(code[128].item(), 0.55e-6, rel_tol=1e-6)
    assert math.isclose(code[126].item(), -0.55e-6, rel_tol=1e-6)
    assert math.isclose(code[254].item(), 1 - 0.9 / 128, rel_tol=1e-6)
    assert math.isclose(code[0].item(), -(1 - 0.9 / 128), rel_tol=1e-6)


def test_unsigned_dynamic_map_facts():
    code = F.create_dynamic_map(signed=False)
    assert code.shape == (256,)
    assert torch.all(code[1:] >= code[:-1])
    assert code[0].item() == 0.0 and code[255].item() == 1.0
    assert torch.all(code >= 0)


def test_normal_map_is_the_nf4_table():
    code = F.create_normal_map()
    assert code.shape == (256,) and code.dtype == torch.float32
    nonpadding = torch.cat([code[:8], code[-8:]])  # 7 negatives, one of the zeros, 8 positives
    assert nonpadding.tolist() == NF4_UPSTREAM
    assert torch.all(code[7:248] == 0)


def test_normal_map_without_extra_value_is_symmetric():
    code = F.create_normal_map(use_extra_value=False)
    values = torch.cat([code[:7], code[-7:]])
    assert torch.equal(values, -values.flip(0))
    assert values.max().item() == 1.0


def test_formats_tables_are_upstream_literals():
    assert list(_formats.NF4_TABLE) == NF4_UPSTREAM
    fp4 = _formats.code_table("fp4")
    magnitudes = torch.tensor([0, 0.0625, 8, 12, 4, 6, 2, 3], dtype=torch.float32) / torch.tensor(12.0)
    assert torch.equal(fp4[:8], magnitudes)
    assert torch.equal(fp4[8:], -magnitudes)
    # Code 8 ("minus zero") holds +0.0, as upstream's get_4bit_type has it.
    assert not torch.signbit(fp4[8]) and not torch.signbit(fp4[0])
    assert torch.equal(F.get_4bit_type("nf4", device="cpu"), torch.tensor(NF4_UPSTREAM))


def test_formats_layout_constants():
    assert _formats.FIRST_VALUE_IN_HIGH_NIBBLE
    assert _formats.DOUBLE_QUANT_BLOCKSIZE == 256
    assert _formats.packed_4bit_shape(7, torch.uint8) == (4, 1)
    assert _formats.packed_4bit_shape(8, torch.float16) == (2, 1)
    assert _formats.packed_4bit_shape(16, torch.float32) == (2, 1)
    assert _formats.packed_4bit_shape(0, torch.bfloat16) == (0, 1)


def test_get_4bit_type_device_and_af4():
    t = F.get_4bit_type("fp4", device="meta")
    assert t.device.type == "meta" and t.shape == (16,)
    assert F.get_4bit_type("nf4").device.type == "cpu"
    af4 = F.get_4bit_type("af4", device="cpu")
    assert af4[0].item() == 1.0 and af4[-1].item() == -1.0
    int4 = F.get_4bit_type("int4", device="cpu")
    assert int4.dtype == torch.float32 and int4[0].item() == 1.0 and int4[-1].item() == -1.0


def test_map_builders_reject_bad_arguments():
    with pytest.raises(ValueError, match="typename"):
        F.get_4bit_type("nf5")
    with pytest.raises(ValueError, match="blocksize"):
        F.get_4bit_type("af4", blocksize=128)
    with pytest.raises(ValueError, match="exponent_bits"):
        F.create_fp8_map(True, 3, 3, 8)
    with pytest.raises(TypeError, match="signed"):
        F.create_dynamic_map(signed="yes")
    with pytest.raises(ValueError, match="max_exponent_bits"):
        F.create_dynamic_map(max_exponent_bits=0)  # 8 and 9 are valid, as upstream's few-bit maps
    with pytest.raises(ValueError, match="2\\*\\*total_bits"):
        F.create_dynamic_map(signed=False, max_exponent_bits=5)
    with pytest.raises(TypeError, match="total_bits"):
        F.create_linear_map(total_bits=8.0)
    with pytest.raises(ValueError, match="offset"):
        F.create_normal_map(offset=1.5)
