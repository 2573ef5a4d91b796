"""Demo: QLoRA fine-tuning with bitsandbytes, transformers and PEFT, nothing downloaded (CPU, Apple GPU or CUDA).

A small Llama-style model is built from a config and loaded through transformers' BitsAndBytesConfig
as 4-bit NF4 with double quantization. LoRA adapters are then trained with bitsandbytes'
PagedAdamW8bit (8-bit optimizer state) on a built-in synthetic task: continuing arithmetic sequences
modulo 64, whose stride the model must read from the prompt. Greedy generations before and after show
what it learned; the report gives the memory of the weights and optimizer state, speed, loss, and which
kernel (native backend or the pure-PyTorch reference) ran each bitsandbytes op. ``--device`` picks where it
all runs (``auto``: CUDA, else Apple's MPS, else the CPU); the model is loaded straight onto that device.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import transformers
from qlora_demo import device as devices
from qlora_demo import model as demo_model
from qlora_demo import report
from qlora_demo.task import Task, show
from tqdm import tqdm

import bitsandbytes as bnb
from bitsandbytes.diagnostics.op_trace import trace_ops

ROOT = Path(__file__).resolve().parent.parent


def evaluate(model, task: Task, batch: torch.Tensor) -> tuple[float, float, torch.Tensor]:
    """(mean loss, fraction of prompts continued exactly right, the generated continuations)."""
    prompt, expected = task.split(batch)
    model.eval()
    with torch.no_grad():
        loss = model(input_ids=batch, labels=task.labels(batch)).loss.item()
        out = model.generate(
            input_ids=prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=expected.shape[1],
            do_sample=False,
        )
    model.train()
    generated = out[:, prompt.shape[1] :]
    exact = (generated == expected).all(dim=1).float().mean().item()
    return loss, exact, generated


def examples(task: Task, batch: torch.Tensor, generated: torch.Tensor, n: int = 3) -> list[str]:
    prompt, expected = task.split(batch)
    prompt, expected, generated = prompt.cpu(), expected.cpu(), generated.cpu()  # one copy, not one per token
    lines = []
    for i in range(n):
        mark = "ok " if torch.equal(generated[i], expected[i]) else "bad"
        lines.append(f"    [{mark}] {show(prompt[i])}  ->  {show(generated[i][:8])} ...")
    return lines


def lr_at(step: int, steps: int, peak: float, warmup: int = 10) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--device", choices=devices.DEVICES, default="cpu", help="auto: cuda if available, else mps, else cpu"
    )
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rank", type=int, default=32, help="LoRA rank")
    parser.add_argument("--steps", type=int, default=200, help="most training steps")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--compute-dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", type=Path, default=ROOT / "build" / "demo" / "loss_curve.png")
    args = parser.parse_args()
    compute_dtype = getattr(torch, args.compute_dtype)
    try:
        device = devices.resolve(args.device)
        devices.check_dtype(device, compute_dtype)
    except ValueError as e:
        parser.error(str(e))

    # Library chatter (PEFT's and transformers' notices, bitsandbytes' "paged falls back" note) would
    # bury the report; the report itself says what ran where.
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()  # the checkpoint write/load bars; training keeps its own
    task = Task()
    data = torch.Generator().manual_seed(args.seed)
    # Batches are drawn on the CPU from CPU generators, then moved: the same data on every device.
    eval_batch = task.sample(64, torch.Generator().manual_seed(args.seed + 1)).to(device)

    print(f"bitsandbytes {bnb.__version__}, transformers {transformers.__version__}, torch {torch.__version__}")
    asked = "" if args.device == device else f" (--device {args.device})"
    print(f"device {device}{asked}: {devices.describe(device)}; device_map={devices.device_map(device)}\n")

    with tempfile.TemporaryDirectory() as tmp:
        dense_bytes = demo_model.write_checkpoint(Path(tmp), args.hidden, args.layers, args.seed)
        start = time.perf_counter()
        with trace_ops() as trace_load:
            model = demo_model.load_4bit(Path(tmp), compute_dtype, device)
            devices.synchronize(device)
        load_s = time.perf_counter() - start
    layers, linear_fp32, linear_4bit = report.fourbit_weight_bytes(model)
    quantized_bytes = model.get_memory_footprint()
    print(
        f"model: Llama-style, hidden {args.hidden}, {args.layers} layers, vocab {model.config.vocab_size};"
        f" {layers} linear layers quantized to NF4 + double quant in {load_s:.2f} s, on {device}"
    )

    model = demo_model.add_lora(model, args.rank)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = bnb.optim.PagedAdamW8bit(trainable, lr=args.lr)

    loss0, exact0, generated0 = evaluate(model, task, eval_batch)
    print(f"\nbefore training: loss {loss0:.3f}, {exact0:.0%} of {len(eval_batch)} prompts continued correctly")
    print("\n".join(examples(task, eval_batch, generated0)))
    print()

    losses: list[float] = []
    trace_train = None
    exact, train_s = exact0, 0.0
    bar = tqdm(range(args.steps), desc="QLoRA training", unit="step", file=sys.stdout, mininterval=0.5)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr)
        batch = task.sample(args.batch, data).to(device)
        start = time.perf_counter()
        if step == 1:  # one representative step (step 0 also creates the optimizer state)
            with trace_ops() as trace_train:
                loss = model(input_ids=batch, labels=task.labels(batch)).loss
                loss.backward()
                optimizer.step()
        else:
            loss = model(input_ids=batch, labels=task.labels(batch)).loss
            loss.backward()
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        devices.synchronize(device)  # queued GPU work counts when it is done
        train_s += time.perf_counter() - start
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}", exact=f"{exact:.0%}")
        if (step + 1) % 25 == 0:
            _, exact, _ = evaluate(model, task, eval_batch)
            bar.set_postfix(loss=f"{losses[-1]:.3f}", exact=f"{exact:.0%}")
            if exact == 1.0:  # learned: every held-out prompt continued exactly
                break
    bar.close()
    steps = len(losses)

    with trace_ops() as trace_generate:
        loss1, exact1, generated1 = evaluate(model, task, eval_batch)
    print(f"\nafter {steps} steps: loss {loss1:.3f}, {exact1:.0%} of {len(eval_batch)} prompts continued correctly")
    print("\n".join(examples(task, eval_batch, generated1)))

    plot = report.plot_losses(losses, args.plot, f"QLoRA (NF4 base, LoRA r={args.rank}, PagedAdamW8bit)")
    state_8bit = report.optimizer_state_bytes(optimizer)
    state_32bit = report.adamw32_state_bytes(trainable)
    n_trainable = sum(p.numel() for p in trainable)

    print("\nreport")
    rows = [
        ("quantized linear weights", f"{report.mib(linear_fp32)} as fp32", f"{report.mib(linear_4bit)} as NF4"),
        ("whole model (fp32 embeddings, lm_head)", report.mib(dense_bytes), report.mib(quantized_bytes)),
        (
            f"optimizer state, {n_trainable:,} LoRA params",
            f"{report.mib(state_32bit)} AdamW 32-bit",
            f"{report.mib(state_8bit)} PagedAdamW8bit",
        ),
    ]
    print("\n".join(report.table(("", "full precision", "bitsandbytes"), rows)))
    print(f"  training: {steps} steps in {train_s:.1f} s, {steps / train_s:.2f} steps/s (batch {args.batch})")
    print(f"  loss: {loss0:.3f} before, {loss1:.3f} after; exact continuations {exact0:.0%} -> {exact1:.0%}")
    print(f"  optimizer state memory: {report.paging(optimizer, device)}")
    print(f"  loss curve: {plot}")
    print("\nwhich kernels ran the bitsandbytes ops (loading, training, evaluating):")
    print("\n".join(report.kernel_summary(trace_load, trace_train, trace_generate)))
    print("\nbitsandbytes ops while loading (quantization on the device):")
    print("\n".join(report.op_lines(trace_load)))
    print("\nbitsandbytes ops in one training step (forward, backward, optimizer):")
    print("\n".join(report.op_lines(trace_train)))
    print("\nbitsandbytes ops while evaluating (forward and greedy generation):")
    print("\n".join(report.op_lines(trace_generate)))


if __name__ == "__main__":
    main()
