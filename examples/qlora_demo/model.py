"""The demo's model: a small Llama-style network built from a config (nothing is downloaded), written as
an ordinary fp32 checkpoint, then loaded through transformers with a 4-bit NF4 BitsAndBytesConfig and
given LoRA adapters with PEFT."""

from __future__ import annotations

from pathlib import Path

import peft
import torch
import transformers

from . import device as devices
from .task import BOS, PAD, VOCAB

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def config(hidden: int, layers: int) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=hidden * 8 // 3 // 64 * 64,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 32),
        num_key_value_heads=max(1, hidden // 32),
        max_position_embeddings=64,
        tie_word_embeddings=False,
        # Larger than Llama's 0.02 so the frozen output layer can express confident predictions.
        initializer_range=0.1,
        bos_token_id=BOS,
        eos_token_id=PAD,
        pad_token_id=PAD,
    )


def write_checkpoint(path: Path, hidden: int, layers: int, seed: int) -> int:
    """Save a randomly initialised fp32 model to ``path``; returns its parameter bytes."""
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config(hidden, layers))
    model.save_pretrained(path)
    return sum(p.numel() * p.element_size() for p in model.parameters())


def load_4bit(path: Path, compute_dtype: torch.dtype, device: str) -> transformers.PreTrainedModel:
    """The checkpoint quantized at load time on ``device``: every linear layer but the output one becomes
    NF4 with double quantization (bitsandbytes.nn.Linear4bit)."""
    quantization = transformers.BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute_dtype,
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, quantization_config=quantization, dtype=compute_dtype, device_map=devices.device_map(device)
    )
    placed = placement(model)
    if placed != {device}:
        raise RuntimeError(f"asked for the model on {device}, transformers placed it on {sorted(placed)}")
    return model


def placement(model: torch.nn.Module) -> set[str]:
    """The device types holding the model's parameters and buffers."""
    return {t.device.type for t in (*model.parameters(), *model.buffers())}


def add_lora(model: transformers.PreTrainedModel, rank: int) -> peft.PeftModel:
    # Gradient checkpointing saves memory on large models; this one is small, so it would only cost time.
    model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    lora = peft.LoraConfig(
        r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=LORA_TARGETS, task_type="CAUSAL_LM"
    )
    return peft.get_peft_model(model, lora)
