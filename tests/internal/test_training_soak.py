"""Soak: 300 training steps of a tiny transformer under the mode. Memory must stay flat
(measured after warm-up: live tensors, the engine's frames, kernels and per-thread switch, the
dispatcher's key state, torch's mode stacks) and the loss must go down."""

import gc

import torch
import torch.nn.functional as F

import hpu_autocast
from hpu_autocast import HpuAutocastMode, _engine
from hpu_autocast._engine import dispatch as _dispatch

VOCAB, D, SEQ, BATCH = 12, 16, 8, 8


class TinyTransformer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(VOCAB, D)
        self.pos = torch.nn.Parameter(torch.randn(SEQ, D) * 0.1)
        self.layer = torch.nn.TransformerEncoderLayer(D, 2, 2 * D, dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(D, VOCAB)

    def forward(self, tokens):
        return self.head(self.layer(self.emb(tokens) + self.pos))


def live_tensors() -> int:
    gc.collect()
    # type() rather than isinstance(): the latter touches lazy module attributes
    # (torch.distributed.reduce_op warns when probed). Fake tensors are torch.compile's, from
    # earlier tests, which torch frees at a time of its own: eager steps make none.
    return sum(1 for o in gc.get_objects() if issubclass(type(o), torch.Tensor) and type(o).__name__ != "FakeTensor")


def snapshot():
    switch = _dispatch.thread_switch()
    keys = _dispatch._keys
    return {
        "tensors": live_tensors(),
        "innermost frame": _engine.innermost(),
        "open regions": switch.ops,
        "key included": torch._C._dispatch_tls_is_dispatch_key_included(keys.ops),
        "kernels": len(keys._registered),
        "function modes": torch._C._len_torch_function_stack(),
        "dispatch modes": len(torch.utils._python_dispatch._get_current_dispatch_mode_stack()),
    }


def test_soak_300_steps_memory_flat_loss_down():
    # Code compiled by earlier tests holds tensors that torch 2.4 frees at a time of its own
    # (during this loop): dropped first, they do not count as a change.
    torch._dynamo.reset()
    model = TinyTransformer()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(1)
    data = torch.randint(0, VOCAB, (16, BATCH, SEQ), generator=gen)
    losses, snaps = [], {}
    for step in range(300):
        tokens = data[step % len(data)]
        with HpuAutocastMode(torch.bfloat16):
            logits = model(tokens)
            # the task: predict each token's successor modulo VOCAB
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), ((tokens + 1) % VOCAB).reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step in (99, 299):
            del logits, loss
            snaps[step] = snapshot()
    assert snaps[99] == snaps[299], (snaps[99], snaps[299])
    assert snaps[299]["innermost frame"] is None and snaps[299]["open regions"] == 0
    assert not snaps[299]["key included"]
    assert snaps[299]["function modes"] == snaps[299]["dispatch modes"] == 0
    assert not hpu_autocast.is_enabled()
    first, last = sum(losses[:20]) / 20, sum(losses[-20:]) / 20
    assert last < 0.5 * first, (first, last)
