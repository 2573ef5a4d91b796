"""The real-client tests' model: a tiny Llama-style checkpoint built from a config (nothing is downloaded),
and loaders that quantize it through transformers' BitsAndBytesConfig."""

from __future__ import annotations

import torch
import transformers

VOCAB = 96
# One hidden dimension of the token embeddings is made large, so after RMSNorm that feature is ~sqrt(hidden)
# = 8 for every token: above LLM.int8()'s outlier threshold 6, so the 8-bit tests take the outlier path.
OUTLIER_DIM = 5

# name -> (BitsAndBytesConfig kwargs, model dtype). The model dtype is what the unquantized parts use.
CONFIGS = {
    "nf4-dq-bf16": (
        dict(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        ),
        torch.bfloat16,
    ),
    "nf4-dq-fp32": (
        dict(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.float32,
        ),
        torch.float32,
    ),
    # FSDP-QLoRA's layout: the packed codes stored in a bf16 tensor (a view of the same bytes).
    "nf4-dq-bf16-storage": (
        dict(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
            bnb_4bit_quant_storage=torch.bfloat16,
        ),
        torch.bfloat16,
    ),
    "fp4": (dict(load_in_4bit=True, bnb_4bit_quant_type="fp4", bnb_4bit_compute_dtype=torch.float32), torch.float32),
    "int8": (dict(load_in_8bit=True, llm_int8_threshold=6.0), torch.float32),
}
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def tiny_config():
    return transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        initializer_range=0.1,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )


def build_checkpoint(path):
    """Write a tiny fp32 Llama checkpoint (safetensors) to ``path``: the same bytes on every run."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(tiny_config())
    with torch.no_grad():
        model.model.embed_tokens.weight[:, OUTLIER_DIM] = 3.0
    model.save_pretrained(path)
    return path


def load_dense(path, dtype=torch.float32):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map="cpu").eval()


def load_quantized(path, name):
    kwargs, dtype = CONFIGS[name]
    config = transformers.BitsAndBytesConfig(**kwargs)
    return transformers.AutoModelForCausalLM.from_pretrained(
        path, quantization_config=config, dtype=dtype, device_map="cpu"
    ).eval()


ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]


def pattern_batch():
    """A sequence the model can learn: each token is the previous one plus 1 (mod a small range)."""
    start = torch.arange(4)[:, None] * 3 + 3
    return (start + torch.arange(16)[None, :]) % 40 + 3


def same_bytes(a, b) -> bool:
    """Bit-equal tensors. Packed 4-bit codes may be stored in a float dtype (bf16 quant_storage), where some
    byte patterns are NaNs that torch.equal would call unequal."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
