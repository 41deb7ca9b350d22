"""Issue 38, item 7: a compiled transformer training step in fp8 against bfloat16, on a GPU, and
against torchao's ``convert_to_float8_training`` on the same model.

    python -m benchmarks.fp8_gpu                 # an H100/H200: about 3 to 5 minutes, --budget-s 300
    python -m benchmarks.fp8_gpu --smoke         # a tiny model on the CPU: checks that it runs

The model is a decoder-only transformer in plain torch (pre-norm, ``scaled_dot_product_attention``
with a causal mask, a GELU MLP 4x wide, an untied ``lm_head``), float32 master weights, AdamW.
One step: the forward and the loss ``torch.compile``d (inductor) and run under the variant's
region, ``backward()`` after it, the optimizer's step, gradients set to ``None``. The variants,
each on a fresh copy of the same initial weights, in this order (a ``--budget-s`` guard skips
the rest, saying so, once the run's time is spent):

| variant | what runs |
| --- | --- |
| ``bf16`` | ``HpuAutocastMode(torch.bfloat16, policy="torch-cuda")`` |
| ``fp8-tensorwise`` | ``HpuAutocastMode(torch.float8_e4m3fn, policy="torch-cuda")`` (recipe ``Tensorwise()``) |
| ``torchao-tensorwise`` | ``convert_to_float8_training(model, config=from_recipe_name("tensorwise"))`` under ``torch.autocast("cuda", torch.bfloat16)`` |
| ``fp8-rowwise`` | the same region with ``fp8=Rowwise()`` |
| ``torchao-rowwise`` | torchao's ``"rowwise"`` recipe |
| ``native-bf16`` | ``torch.autocast("cuda", torch.bfloat16)``: the reference of torchao's own speed-up |

Every ``nn.Linear`` runs in fp8 in both (``lm_head`` too; no attention GEMM lies outside
``scaled_dot_product_attention``, which runs in bfloat16 in every variant), so both convert the
same GEMMs. The torchao variants are skipped, with a line saying why, where ``import torchao``
fails. Per variant: the median milliseconds of the timed steps (CUDA events around each step),
tokens per second, the peak allocated memory, the first step's seconds (compilation), the first
and last losses. It prints a table and the ratios (fp8 / bf16 as a speed-up, ours / torchao as a
time ratio) and writes ``OUT/fp8_gpu.json``. Exit status: 0 when every variant that was not
skipped ran, 1 when one failed (its error is printed and recorded), 2 when it cannot run (no
CUDA, or a GPU without fp8: compute capability below 8.9).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import datetime
import gc
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, ContextManager, Dict, List, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

import hpu_autocast
from hpu_autocast import HpuAutocastMode, get_preset
from hpu_autocast.policies.recipes import Rowwise

__all__ = ["Config", "FULL", "SMOKE", "Decoder", "run", "format_table", "main"]

E4 = torch.float8_e4m3fn
ORDER = ("bf16", "fp8-tensorwise", "torchao-tensorwise", "fp8-rowwise", "torchao-rowwise", "native-bf16")
TORCHAO = ("torchao-tensorwise", "torchao-rowwise")


@dataclasses.dataclass(frozen=True)
class Config:
    d_model: int
    layers: int
    heads: int
    seq: int
    batch: int
    vocab: int
    warmup: int
    steps: int


#: An H200 (141 GB): 440M parameters (7 GB with their gradients and AdamW's state) and, in
#: bfloat16, activations and logits of 16k tokens: about 20-25 GB at peak (estimated).
FULL = Config(d_model=2048, layers=6, heads=16, seq=2048, batch=8, vocab=32768, warmup=5, steps=20)
SMOKE = Config(d_model=64, layers=1, heads=4, seq=32, batch=2, vocab=128, warmup=1, steps=2)


# -- the model ------------------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.up, self.down = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, d))
        return x + self.down(F.gelu(self.up(self.norm2(x)), approximate="tanh"))


class Decoder(nn.Module):
    """A decoder-only language model: embeddings, ``layers`` pre-norm blocks, a final norm, and
    an untied ``lm_head``."""

    def __init__(self, c: Config) -> None:
        super().__init__()
        self.embed = nn.Embedding(c.vocab, c.d_model)
        self.pos = nn.Parameter(torch.randn(c.seq, c.d_model) * 0.02)
        self.blocks = nn.ModuleList(Block(c.d_model, c.heads) for _ in range(c.layers))
        self.norm = nn.LayerNorm(c.d_model)
        self.lm_head = nn.Linear(c.d_model, c.vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.pos[: ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm(x))


def loss_fn(model: nn.Module, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model(ids)
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


# -- the variants -----------------------------------------------------------------------------------
def _torchao():
    """``(convert_to_float8_training, Float8LinearConfig)``, or the reason torchao is missing."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except Exception as e:  # ImportError, or whatever a torchao built for another torch raises
        return f"{type(e).__name__}: {e}"
    return convert_to_float8_training, Float8LinearConfig


def _policy(device: str) -> str:
    return "torch-cuda" if device == "cuda" else "torch-cpu"  # (--smoke: the CPU's lists)


def _variant(name: str, model: nn.Module, device: str, torchao) -> Callable[[], ContextManager]:
    """The region factory of ``name``; converts ``model`` in place for the torchao variants."""
    policy = get_preset(_policy(device))
    if name == "bf16":
        return lambda: HpuAutocastMode(torch.bfloat16, policy=policy, device_type=device)
    if name == "fp8-tensorwise":
        return lambda: HpuAutocastMode(E4, policy=policy, device_type=device)
    if name == "fp8-rowwise":
        rowwise = dataclasses.replace(policy, fp8=Rowwise())
        return lambda: HpuAutocastMode(E4, policy=rowwise, device_type=device)
    if name == "native-bf16":
        return lambda: torch.autocast(device, dtype=torch.bfloat16)
    convert, config_cls = torchao
    config = config_cls.from_recipe_name(name.split("-")[1])
    if device != "cuda":
        config = dataclasses.replace(config, emulate=True)  # torchao's CPU path: no _scaled_mm
    convert(model, config=config)
    return lambda: torch.autocast(device, dtype=torch.bfloat16)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_variant(
    name: str, base: nn.Module, c: Config, device: str, backend: str, torchao, bf16_loss: Optional[float] = None
) -> Dict[str, object]:
    """One variant: a fresh copy of ``base``, compiled, ``c.warmup`` steps then ``c.steps`` timed.
    An fp8 variant whose first loss is ``bf16_loss`` (the bf16 region's) ran no fp8: it raises."""
    model = copy.deepcopy(base).to(device).train()
    region = _variant(name, model, device, torchao)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4, **({"fused": True} if device == "cuda" else {}))
    fn = loss_fn if backend == "none" else torch.compile(loss_fn, backend=backend)
    g = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, c.vocab, (c.batch, c.seq + 1), generator=g).to(device)
    inputs, targets = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    losses: List[float] = []

    def step() -> torch.Tensor:
        with region():
            loss = fn(model, inputs, targets)
        loss.backward()
        opt.step()
        for p in params:
            p.grad = None
        return loss.detach()

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    _sync(device)
    start = time.perf_counter()
    losses.append(step().item())  # the first step compiles
    first_s = time.perf_counter() - start
    if name.startswith("fp8") and bf16_loss is not None and losses[0] == bf16_loss:
        raise RuntimeError(
            f"the first loss {losses[0]!r} equals the bf16 region's to the last bit: its GEMMs did not "
            "run in fp8 (a compiled graph of the bf16 region served again?)"
        )
    for _ in range(c.warmup - 1):
        step()
    times_ms: List[float] = []
    for _ in range(c.steps):
        if device == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            loss = step()
            end.record()
            end.synchronize()
            times_ms.append(begin.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            loss = step()
            times_ms.append((time.perf_counter() - t0) * 1e3)
    losses.append(loss.item())
    median = statistics.median(times_ms)
    return {
        "ms_per_step": median,
        "step_ms": times_ms,
        "tokens_per_s": c.batch * c.seq / (median / 1e3),
        "peak_mem_gb": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None,
        "first_step_s": first_s,
        "loss_first": losses[0],
        "loss_last": losses[-1],
    }


# -- the run --------------------------------------------------------------------------------------
def check_device(device: str) -> Optional[str]:
    """Why this device cannot run the benchmark, or ``None``."""
    if device == "cpu":
        return None
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False); accepted: a GPU with fp8, or --smoke on the CPU"
    cap = torch.cuda.get_device_capability()
    if cap < (8, 9):
        return (
            f"{torch.cuda.get_device_name()} has compute capability {cap[0]}.{cap[1]}, which has no fp8 GEMMs; "
            "accepted: 8.9 or later (Ada, Hopper: H100/H200, Blackwell)"
        )
    return None


def _machine(device: str) -> Dict[str, object]:
    from .run import _git_commit
    from .workloads import cpu_model

    cuda = device == "cuda"
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hpu_autocast": hpu_autocast.__version__,
        "engine": hpu_autocast.ENGINE,
        "commit": _git_commit(),
        "device": device,
        "device_name": torch.cuda.get_device_name() if cuda else cpu_model(),
        "capability": list(torch.cuda.get_device_capability()) if cuda else None,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def ratios(variants: Dict[str, Dict[str, object]]) -> Dict[str, float]:
    """Speed-ups over the bf16 region (``bf16 ms / variant ms``: above 1 is faster) and ours
    against torchao (``ours ms / torchao ms``: at most 1.05 is issue 38's "within 5%")."""
    ms = {k: v["ms_per_step"] for k, v in variants.items() if "ms_per_step" in v}
    out: Dict[str, float] = {}
    for name in ("fp8-tensorwise", "fp8-rowwise", "torchao-tensorwise", "torchao-rowwise", "native-bf16"):
        if "bf16" in ms and name in ms:
            out[f"bf16 / {name} (speed-up)"] = ms["bf16"] / ms[name]
    for recipe in ("tensorwise", "rowwise"):
        if f"fp8-{recipe}" in ms and f"torchao-{recipe}" in ms:
            out[f"fp8-{recipe} / torchao-{recipe} (time)"] = ms[f"fp8-{recipe}"] / ms[f"torchao-{recipe}"]
    return out


def run(
    c: Config,
    device: str,
    backend: str,
    budget_s: float,
    only: Sequence[str] = ORDER,
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> Dict[str, object]:
    started = time.perf_counter()
    torchao = _torchao()
    torch.manual_seed(0)
    base = Decoder(c)  # on the CPU: every variant copies it to the device
    variants: Dict[str, Dict[str, object]] = {}
    for name in only:
        if name in TORCHAO and isinstance(torchao, str):
            variants[name] = {"skipped": f"torchao is not importable ({torchao})"}
            log(f"  {name}: skipped: torchao is not importable ({torchao}); comparing bf16 and fp8 only")
            continue
        spent = time.perf_counter() - started
        if spent > budget_s:
            variants[name] = {"skipped": f"the budget of {budget_s:.0f} s was spent ({spent:.0f} s)"}
            log(f"  {name}: skipped: --budget-s {budget_s:.0f} spent ({spent:.0f} s so far)")
            continue
        log(f"  {name} ...")
        try:
            bf16_loss = variants.get("bf16", {}).get("loss_first")
            variants[name] = time_variant(name, base, c, device, backend, torchao, bf16_loss)
        except Exception as e:  # recorded and printed, and the exit status says so: never silent
            variants[name] = {"error": f"{type(e).__name__}: {e}"}
            log(f"  {name}: FAILED: {type(e).__name__}: {e}")
        finally:
            if backend != "none":
                torch._dynamo.reset()  # each variant compiles afresh (and main() may run in-process)
            if device == "cuda":  # the last variant's model, optimizer state and graphs: gone
                gc.collect()
                torch.cuda.empty_cache()
    return {
        "machine": _machine(device),
        "settings": {
            **dataclasses.asdict(c),
            "backend": backend,
            "budget_s": budget_s,
            "policy": _policy(device),
            "tokens_per_step": c.batch * c.seq,
            "params_m": round(sum(p.numel() for p in base.parameters()) / 1e6, 1),
        },
        "variants": variants,
        "ratios": ratios(variants),
        "wall_s": round(time.perf_counter() - started, 1),
    }


def format_table(results: Dict[str, object]) -> str:
    m, s = results["machine"], results["settings"]
    lines = [
        f"hpu_autocast fp8 training step: {m['device_name']} ({m['device']}), torch {m['torch']}, "
        f"engine {m['engine']}, policy {s['policy']}, torch.compile(backend={s['backend']!r})",
        f"  decoder d={s['d_model']} layers={s['layers']} heads={s['heads']} seq={s['seq']} batch={s['batch']} "
        f"vocab={s['vocab']} ({s['params_m']}M parameters), {s['warmup']} warm-up and {s['steps']} timed steps",
        "",
        f"{'variant':<20} {'ms/step':>9} {'tokens/s':>11} {'peak GB':>8} {'1st step s':>10} "
        f"{'loss first':>11} {'loss last':>10}",
    ]
    for name, v in results["variants"].items():
        if "ms_per_step" not in v:
            lines.append(f"{name:<20} {'SKIPPED: ' + v['skipped'] if 'skipped' in v else 'FAILED: ' + v['error']}")
            continue
        peak = f"{v['peak_mem_gb']:8.1f}" if v["peak_mem_gb"] is not None else f"{'-':>8}"
        lines.append(
            f"{name:<20} {v['ms_per_step']:9.2f} {v['tokens_per_s']:11.0f} {peak} {v['first_step_s']:10.1f} "
            f"{v['loss_first']:11.4f} {v['loss_last']:10.4f}"
        )
    lines.append("")
    for label, value in results["ratios"].items():
        lines.append(f"  {label:<44} {value:6.3f}x")
    if not results["ratios"]:
        lines.append("  no ratio: fewer than two variants ran")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.fp8_gpu",
        description="A compiled transformer training step: bf16 and fp8 regions "
        "against torchao's float8 training; writes OUT/fp8_gpu.json.",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a tiny model on the CPU (d=64, 1 layer, 2 steps, eager Dynamo): checks that it runs",
    )
    parser.add_argument(
        "--backend",
        default=None,
        help="torch.compile backend (default inductor; smoke: eager), or 'none' for no compile",
    )
    parser.add_argument(
        "--budget-s", type=float, default=300.0, help="start no variant after this many seconds (default 300)"
    )
    parser.add_argument("--steps", type=int, default=None, help="timed steps per variant (default 20)")
    parser.add_argument("--batch", type=int, default=None, help="sequences per step (default 8)")
    parser.add_argument("--only", default=None, help=f"comma-separated variants (of {', '.join(ORDER)})")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="output folder")
    args = parser.parse_args(argv)
    only = [v.strip() for v in args.only.split(",") if v.strip()] if args.only else list(ORDER)
    unknown = [v for v in only if v not in ORDER]
    if unknown:
        parser.error(f"unknown variant {unknown[0]!r} in --only {args.only!r}; accepted: {', '.join(ORDER)}")
    c = SMOKE if args.smoke else FULL
    if args.steps is not None or args.batch is not None:
        if (args.steps is not None and args.steps < 1) or (args.batch is not None and args.batch < 1):
            parser.error("--steps and --batch must be at least 1")
        c = dataclasses.replace(c, steps=args.steps or c.steps, batch=args.batch or c.batch)
    device = "cpu" if args.smoke else "cuda"
    why = check_device(device)
    if why is not None:
        print(f"python -m benchmarks.fp8_gpu: cannot run: {why}", file=sys.stderr)
        return 2
    backend = args.backend or ("eager" if args.smoke else "inductor")
    with contextlib.ExitStack() as stack:
        import torch._functorch.config

        if hasattr(torch._functorch.config, "enable_autograd_cache"):
            # Note: AOTAutograd's cache keys a graph by Dynamo's graph, which is the same under a
            # bf16 and an fp8 region (the region is not in it): with it on, an fp8 variant after
            # the bf16 one (in this process, or in an earlier one through the on-disk cache) got
            # the bf16 region's compiled step, bf16's loss to the last bit (torch 2.13, inductor).
            stack.enter_context(torch._functorch.config.patch(enable_autograd_cache=False))
        if device == "cpu":
            threads = torch.get_num_threads()
            stack.callback(torch.set_num_threads, threads)
            torch.set_num_threads(1)
        results = run(c, device, backend, args.budget_s, only)
    print(format_table(results))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "fp8_gpu.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {path} in {results['wall_s']:.1f} s")
    failed = [n for n, v in results["variants"].items() if "error" in v]
    if failed:
        print(f"python -m benchmarks.fp8_gpu: {len(failed)} variant(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    if not all(math.isfinite(v["loss_last"]) for v in results["variants"].values() if "loss_last" in v):
        print("python -m benchmarks.fp8_gpu: a variant's loss is not finite", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
