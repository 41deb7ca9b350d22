"""A Hugging Face ``Trainer`` run whose autocast is ``HpuAutocastMode``: a tiny Llama (random
weights, nothing downloaded) trained for a few steps on random tokens, the loss printed per step.

    python examples/trainer_example.py [--steps N] [--policy hpu|torch-cpu|...] [--output-dir DIR]

Needs the ``models`` extra: ``pip install -c constraints.txt -e ".[models]"``.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_callback import PrinterCallback

import hpu_autocast
from hpu_autocast import HpuAutocastMode


class HpuAutocastTrainer(Trainer):
    """A ``Trainer`` whose forward pass and loss run under ``HpuAutocastMode(dtype, policy=policy)``.

    Note: Trainer's ``training_step`` (and ``prediction_step``, for evaluation) enters
    ``compute_loss_context_manager()``, which enters ``autocast_smart_context_manager()``, around
    ``compute_loss`` alone; ``accelerator.backward(loss)`` and the optimizer step come after it.
    That is exactly a region's extent, and ``autocast_smart_context_manager`` is the method Trainer
    names for autocast, so it is the one overridden (overriding ``compute_loss`` would also wrap
    the forward, but it is the method users override for their own loss). Trainer's own mixed
    precision stays off (``bf16=False, fp16=False``), so accelerate adds no autocast of its own.
    """

    def __init__(self, *args, dtype: torch.dtype = torch.bfloat16, policy: str = "hpu", **kwargs) -> None:
        self.autocast_dtype, self.autocast_policy = dtype, policy
        super().__init__(*args, **kwargs)

    def autocast_smart_context_manager(self, cache_enabled: bool | None = True) -> contextlib.AbstractContextManager:
        return HpuAutocastMode(self.autocast_dtype, policy=self.autocast_policy, cache_enabled=cache_enabled)


class PrintLoss(TrainerCallback):
    """Prints the loss Trainer logs, one line per step (with ``logging_steps=1``)."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(logs["loss"])
            print(f"step {state.global_step}: loss {logs['loss']:.4f}")


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=16,
        )
    )


def random_tokens(n: int = 16, seq: int = 16) -> list[dict]:
    """A causal LM data set as a list of examples; the model shifts the labels itself."""
    ids = torch.randint(0, 64, (n, seq), generator=torch.Generator().manual_seed(1))
    return [{"input_ids": x, "labels": x} for x in ids]


def train(steps: int, policy: str, output_dir: str, trainer_cls: type = HpuAutocastTrainer) -> list[float]:
    """Train for ``steps`` steps (batch 2) and return the loss of each."""
    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=steps,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        bf16=False,
        fp16=False,
        disable_tqdm=True,
        dataloader_pin_memory=False,
        seed=0,
    )
    printer = PrintLoss()
    trainer = trainer_cls(
        model=tiny_llama(), args=args, train_dataset=random_tokens(), callbacks=[printer], policy=policy
    )
    trainer.remove_callback(PrinterCallback)  # PrintLoss prints the loss; no dict of every log
    trainer.train()
    return printer.losses


def main(argv=None) -> list[float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--policy", default="hpu", choices=hpu_autocast.preset_names())
    parser.add_argument(
        "--output-dir", help="Trainer's output directory (default: a temporary one); nothing is saved there"
    )
    args = parser.parse_args(argv)
    if args.output_dir:
        return train(args.steps, args.policy, args.output_dir)
    with tempfile.TemporaryDirectory() as output_dir:
        return train(args.steps, args.policy, output_dir)


if __name__ == "__main__":
    main()
