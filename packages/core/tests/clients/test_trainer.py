"""transformers' Trainer with bitsandbytes optimizers chosen by name (optim="paged_adamw_8bit",
"adamw_8bit"): the Trainer builds bnb.optim.AdamW(..., optim_bits=8, is_paged=...) and, after
construction, registers a 32-bit override for every nn.Embedding with the GlobalOptimManager."""

from __future__ import annotations

import peft
import torch
import transformers
from tiny_llama import ATTENTION, load_dense, load_quantized, pattern_batch

import bitsandbytes as bnb


def dataset():
    batch = pattern_batch()
    return [{"input_ids": row, "labels": row} for row in batch]


def make_trainer(model, optim, out, steps=8, lr=1e-2):
    args = transformers.TrainingArguments(
        output_dir=str(out),
        optim=optim,
        max_steps=steps,
        per_device_train_batch_size=4,
        learning_rate=lr,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
    )
    return transformers.Trainer(model=model, args=args, train_dataset=dataset())


def losses(trainer):
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def test_qlora_with_trainer_paged_adamw_8bit(checkpoint, tmp_path):
    torch.manual_seed(0)
    model = peft.prepare_model_for_kbit_training(load_quantized(checkpoint, "nf4-dq-fp32"))
    # r=64 on a 64-wide model: most adapters have 4096 elements, the smallest size that gets 8-bit state;
    # lora_B of k_proj/v_proj (32 outputs: grouped-query attention) has 2048 and stays 32-bit.
    config = peft.LoraConfig(r=64, lora_alpha=64, lora_dropout=0.0, target_modules=ATTENTION, task_type="CAUSAL_LM")
    model = peft.get_peft_model(model, config)
    trainer = make_trainer(model, "paged_adamw_8bit", tmp_path, lr=2e-3)
    trainer.train()

    optimizer = trainer.optimizer.optimizer  # the Trainer wraps it in accelerate's AcceleratedOptimizer
    assert type(optimizer) is bnb.optim.AdamW and optimizer.is_paged
    trained = [p for p in model.parameters() if p.requires_grad]
    dtypes = {p.numel(): optimizer.state[p]["state1"].dtype for p in trained}
    assert dtypes == {4096: torch.uint8, 2048: torch.float32}
    history = losses(trainer)
    assert len(history) == 8 and all(torch.isfinite(torch.tensor(history)))
    assert history[-1] < 0.8 * history[0]


def test_trainer_adamw_8bit_keeps_embeddings_in_32bit(checkpoint, tmp_path):
    torch.manual_seed(0)
    model = load_dense(checkpoint).train()
    trainer = make_trainer(model, "adamw_8bit", tmp_path, steps=2, lr=1e-3)
    trainer.train()

    optimizer = trainer.optimizer.optimizer
    assert type(optimizer) is bnb.optim.AdamW and not optimizer.is_paged

    def state_dtype(p):
        return optimizer.state[p]["state1"].dtype

    # Registered by the Trainer after the optimizer was built: the embedding (6144 elements) is 32-bit.
    assert state_dtype(model.model.embed_tokens.weight) == torch.float32
    # The same-sized output layer and the 4096-element projections get 8-bit state; norms are too small.
    assert state_dtype(model.lm_head.weight) == torch.uint8
    assert state_dtype(model.model.layers[0].self_attn.q_proj.weight) == torch.uint8
    assert state_dtype(model.model.layers[0].input_layernorm.weight) == torch.float32
    assert all(torch.isfinite(torch.tensor(losses(trainer))))
