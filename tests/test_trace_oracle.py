"""The trace oracle (issue 28): under ``torch-cuda`` (on fake CUDA tensors, no GPU needed) and
``torch-cpu`` (on real CPU tensors), the ATen calls that reach below autocast equal native
autocast's: overloads, order, argument dtypes and shapes, dtype and scalar arguments (_trace's
Note says how they are recorded, and why by a tensor subclass).

* every op torch registers for ``AutocastCUDA`` / ``AutocastCPU``, on OpInfo samples where an
  OpInfo covers it and on the project's samples (tests/_samples.py), with float32 inputs and with
  inputs already in the lower dtype, for float16 and bfloat16;
* small models, forward and loss in the region: an MLP with each loss in ``torch.nn``, a CNN in
  eval mode, norms and reductions, an LSTM and a GRU, attention (``nn.MultiheadAttention``,
  SDPA, a transformer layer), embeddings.

It runs under whichever engine is active (CI runs the suite under each).
"""

from __future__ import annotations

import concurrent.futures
import functools
import itertools
import warnings
from typing import Callable, Dict, List, Tuple

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call
from torch.utils._pytree import tree_map

from _parity import VARIANTS
from _samples import SAMPLES, build
from _trace import compare, first_difference, trace
from hpu_autocast._engine import core as _core
from hpu_autocast._facts.ops import op_base_name, registered_for

with warnings.catch_warnings():  # its import adds warning filters; keep the suite's own
    from torch.testing._internal.common_methods_invocations import op_db

#: What torch says of the ops themselves when the oracle calls them (the registered ops include
#: deprecated ones, and native's kernels warn alike under both runs): nothing about a region.
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*is deprecated in favor of:UserWarning"),  # torch.lu, qr, ...
    pytest.mark.filterwarnings("ignore:Using torch.cross without specifying the dim arg:UserWarning"),
    pytest.mark.filterwarnings("ignore:A window was not provided:UserWarning"),  # stft's sample
    pytest.mark.filterwarnings("ignore:stft with return_complex=False is deprecated:UserWarning"),
    pytest.mark.filterwarnings("ignore:PyTorch was compiled without cuDNN:UserWarning"),  # lstm, fake CUDA
    pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight:UserWarning"),  # native's own
]

DEVICES = {"cuda": "AutocastCUDA", "cpu": "AutocastCPU"}
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}

# --- the ops ---------------------------------------------------------------------------------------

#: Registered names the project's samples spell differently.
SAMPLE_ALIASES = {"lstm_cell": "LSTMCell", "rnn_tanh_cell": "RNNCell"}

#: Registered ops with no sample of their own, and why: on a GPU the public ops reach them
#: (convolutions reach cuDNN's, SDPA its flash kernel, the RNN cells their fused kernels); on fake
#: CUDA tensors a CPU build takes other paths, which the samples of those public ops trace.
NOT_SAMPLED = {
    "_scaled_dot_product_flash_attention",
    "_thnn_fused_gru_cell",
    "_thnn_fused_lstm_cell",
    "cudnn_convolution",
    "cudnn_convolution_transpose",
    "mkldnn_rnn_layer",
    "_cudnn_rnn",
}  # registered by CUDA builds (torch 2.14.1's wheel): nn.LSTM reaches it on a GPU

#: OpInfo samples taken per OpInfo (their first ones: the cheapest, and enough for the dtypes).
OPINFO_SAMPLES = 2


def _rnn_relu_cell():
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)
    return torch.rnn_relu_cell, (r(2, 3), r(2, 4), r(4, 3), r(4, 4), r(4), r(4)), {}


EXTRA_SAMPLES = {"rnn_relu_cell": _rnn_relu_cell}


def _opinfos() -> Dict[str, list]:
    by: Dict[str, list] = {}
    for info in op_db:
        for name in {info.aten_name, info.name.replace(".", "_")}:
            by.setdefault(name, []).append(info)
    return by


OPINFOS = _opinfos()


def _op_names(device: str) -> List[str]:
    return sorted({op_base_name(op) for op in registered_for(DEVICES[device])} - NOT_SAMPLED)


def _opinfo_samples(name: str) -> List[Tuple[Callable, tuple, dict]]:
    out = []
    for info in OPINFOS.get(name, []):
        if torch.float32 in info.supported_dtypes("cpu"):
            for s in itertools.islice(info.sample_inputs("cpu", torch.float32), OPINFO_SAMPLES):
                out.append((info.op, (s.input,) + tuple(s.args), dict(s.kwargs)))
    return out


@functools.lru_cache(maxsize=None)
def _opinfo_samples_once(name: str) -> List[Tuple[Callable, tuple, dict]]:
    # Made once per op for its four cases (two devices, two dtypes; no case writes its inputs: each
    # is run by native and by the engine alike), and in a thread of its own: OpInfo's
    # sample_inputs looks for a unittest test up the caller's stack (inspect.stack(), which reads
    # the source of every frame), 0.1 s a call under pytest's stack, a thread's own stack is short.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(_opinfo_samples, name).result()


def samples(name: str) -> List[Tuple[Callable, tuple, dict]]:
    """Float32 calls of ``name``: its OpInfos' first samples, then the project's sample."""
    out = list(_opinfo_samples_once(name))
    own = SAMPLE_ALIASES.get(name, name)
    if own in SAMPLES:
        out.append(build(own))
    if name in EXTRA_SAMPLES:
        out.append(EXTRA_SAMPLES[name]())
    return out


def _marked(case: str, values: tuple):
    return pytest.param(*values, id=case)


OP_CASES = [
    _marked(f"{device}-{dname}-{name}", (device, dname, name))
    for device in DEVICES
    for dname in DTYPES
    for name in _op_names(device)
]


@pytest.mark.parametrize("device,dname,name", OP_CASES)
def test_op_calls_below_autocast_match_native(device, dname, name):
    # float32 inputs show the lower-precision and fp32_* entries, inputs already in the lower
    # dtype the float32 ones (and whether a dtype argument or a cast carries them there).
    dtype, found = DTYPES[dname], []
    for (fn, args, kwargs), variant in itertools.product(samples(name), ("f32", "lower")):
        args, kwargs = tree_map(VARIANTS[variant](dtype), (args, kwargs))
        _, diff = compare(fn, args, kwargs, device, dtype)
        if diff:
            found.append(f"{variant} sample {getattr(fn, '__name__', fn)}: {diff}")
    assert not found, "\n".join(found)


def test_every_registered_op_has_a_sample():
    # A torch that registers a new op for a native autocast fails here until it has a sample.
    has = lambda n: n in OPINFOS or SAMPLE_ALIASES.get(n, n) in SAMPLES or n in EXTRA_SAMPLES
    bare = {device: [n for n in _op_names(device) if not has(n)] for device in DEVICES}
    assert bare == {"cuda": [], "cpu": []}, f"registered, with no OpInfo nor project sample: {bare}"


# --- the models ------------------------------------------------------------------------------------

_gen = torch.Generator()
r = lambda *shape: torch.randn(*shape, generator=_gen)
pos = lambda *shape: torch.rand(*shape, generator=_gen) + 0.5
unit = lambda *shape: torch.rand(*shape, generator=_gen)
idx = lambda high, *shape: torch.randint(0, high, shape, generator=_gen)
same = lambda y: (y,)

#: Every loss in ``torch.nn``: its constructor's arguments, what it takes of the MLP's (3, 4)
#: output, and its targets (made from a fixed seed).
LOSSES: Dict[str, Tuple[dict, Callable, Callable]] = {
    "L1Loss": ({}, same, lambda: (r(3, 4),)),
    "MSELoss": ({}, same, lambda: (r(3, 4),)),
    "SmoothL1Loss": ({}, same, lambda: (r(3, 4),)),
    "HuberLoss": ({}, same, lambda: (r(3, 4),)),
    "NLLLoss": ({}, lambda y: (y.log_softmax(-1),), lambda: (idx(4, 3),)),
    "CrossEntropyLoss": ({}, same, lambda: (idx(4, 3),)),
    "PoissonNLLLoss": ({}, same, lambda: (pos(3, 4),)),
    "GaussianNLLLoss": ({}, same, lambda: (r(3, 4), pos(3, 4))),
    "KLDivLoss": ({"reduction": "batchmean"}, lambda y: (y.log_softmax(-1),), lambda: (r(3, 4).softmax(-1),)),
    "BCELoss": ({}, lambda y: (y.sigmoid(),), lambda: (unit(3, 4),)),
    "BCEWithLogitsLoss": ({}, same, lambda: (unit(3, 4),)),
    "HingeEmbeddingLoss": ({}, same, lambda: (torch.sign(r(3, 4)),)),
    "SoftMarginLoss": ({}, same, lambda: (torch.sign(r(3, 4)),)),
    "MultiLabelMarginLoss": ({}, same, lambda: (torch.tensor([[0, 1, -1, 0]] * 3),)),
    "MultiLabelSoftMarginLoss": ({}, same, lambda: ((unit(3, 4) > 0.5).float(),)),
    "MultiMarginLoss": ({}, same, lambda: (idx(4, 3),)),
    "CosineEmbeddingLoss": ({}, same, lambda: (r(3, 4), torch.tensor([1, -1, 1]))),
    # torch.select, not y[:, 0]: indexing's Python binding makes a CUDA device guard.
    "MarginRankingLoss": ({}, lambda y: (y.select(1, 0), y.select(1, 1)), lambda: (torch.sign(r(3)),)),
    "TripletMarginLoss": ({}, same, lambda: (r(3, 4), r(3, 4))),
    "TripletMarginWithDistanceLoss": ({}, same, lambda: (r(3, 4), r(3, 4))),
    "CTCLoss": (
        {},
        lambda y: (y.log_softmax(-1).unsqueeze(1),),
        lambda: (torch.tensor([[1, 2]]), torch.tensor([3]), torch.tensor([2])),
    ),
    "AdaptiveLogSoftmaxWithLoss": ({"in_features": 4, "n_classes": 6, "cutoffs": [2]}, same, lambda: (idx(6, 3),)),
    "LinearCrossEntropyLoss": ({"in_features": 4, "num_classes": 5}, same, lambda: (idx(5, 3),)),  # torch 2.13 on
}
LOSSES = {name: case for name, case in LOSSES.items() if hasattr(nn, name)}  # this torch's


def _losses_in_torch() -> List[str]:
    return sorted(
        n
        for n in dir(nn)
        if n.endswith("Loss") and isinstance(getattr(nn, n), type) and issubclass(getattr(nn, n), nn.Module)
    )


class MLPWithLoss(nn.Module):
    """An MLP and one loss; its forward is a training step's forward: the loss of a batch."""

    def __init__(self, loss: str) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4))
        kwargs, self.take, _ = LOSSES[loss]
        self.loss = getattr(nn, loss)(**kwargs)

    def forward(self, x, *targets):
        return self.loss(*self.take(self.net(x)), *targets)


class NormsAndReductions(nn.Module):
    """The norms, then the reductions native runs in float32 (fp32 and fp32_set_opt_dtype lists)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 8)
        self.norms = nn.Sequential(nn.LayerNorm(8), nn.GroupNorm(2, 8), nn.RMSNorm(8), nn.BatchNorm1d(8))

    def forward(self, x):
        h = self.norms(self.lin(x))
        return (
            h.sum(),
            h.prod(1),
            h.cumsum(1),
            h.cumprod(1),
            h.softmax(-1),
            h.log_softmax(-1),
            h.norm(),
            torch.linalg.vector_norm(h, dim=1),
            h.mean(0),
            h.logsumexp(1),
            F.normalize(h),
        )


class Recurrent(nn.Module):
    """An LSTM or a GRU (initial states given: a CPU build cannot make fake CUDA zeros), then a head."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.rnn = getattr(nn, kind)(4, 8, num_layers=2, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x, *state):
        out, _ = self.rnn(x, state if len(state) > 1 else state[0])
        return self.head(out)


class SDPA(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(8, 24), nn.Linear(8, 8)

    def forward(self, x):
        q, k, v = (t.unflatten(-1, (2, 4)).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        return self.out(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2))


class MHA(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=True)


class Embeddings(nn.Module):
    """An embedding and a bag (its offsets given: from 2-d ids F.embedding_bag makes them with
    ``torch.arange(device=...)``, which a CPU build cannot do on CUDA)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.bag, self.head = nn.Embedding(10, 8), nn.EmbeddingBag(10, 8, mode="mean"), nn.Linear(8, 3)

    def forward(self, ids, offsets):
        return self.head(self.emb(ids).mean(1) + self.bag(ids.flatten(), offsets))


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 3),
    ).eval()


def _rnn_inputs(kind: str) -> tuple:
    return (r(2, 5, 4), r(2, 2, 8)) + ((r(2, 2, 8),) if kind == "LSTM" else ())


#: Each model: a fresh module (seeded) and its inputs; forward (and loss) traced in the region.
MODELS: Dict[str, Callable[[], Tuple[nn.Module, tuple]]] = {
    **{f"mlp+{loss}": (lambda loss=loss: (MLPWithLoss(loss), (r(3, 6),) + LOSSES[loss][2]())) for loss in LOSSES},
    "cnn-eval": lambda: (_cnn(), (r(2, 3, 8, 8),)),
    "norms-reductions": lambda: (NormsAndReductions().eval(), (r(3, 6),)),
    "lstm": lambda: (Recurrent("LSTM"), _rnn_inputs("LSTM")),
    "gru": lambda: (Recurrent("GRU"), _rnn_inputs("GRU")),
    "sdpa": lambda: (SDPA(), (r(2, 5, 8),)),
    "multihead-attention": lambda: (MHA(), (r(2, 5, 8),)),
    "transformer-layer": lambda: (nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True), (r(2, 5, 8),)),
    "embeddings": lambda: (Embeddings(), (idx(10, 2, 5), torch.tensor([0, 5]))),
}


def build_model(name: str) -> Tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    _gen.manual_seed(0)
    return MODELS[name]()


#: Models a CPU build cannot run on fake CUDA tensors, and why; they are traced on CPU.
NOT_ON_FAKE_CUDA = {
    # torch's Python binding of Tensor.contiguous() (in F.multi_head_attention_forward) makes a
    # CUDA device guard before it dispatches, and a CPU build has no CUDA guard.
    "multihead-attention": "Tensor.contiguous() makes a CUDA device guard",
    "transformer-layer": "Tensor.contiguous() makes a CUDA device guard",
    # Fake tensors cannot answer what depends on values (the variance check, nonzero's size).
    "mlp+GaussianNLLLoss": "torch.any(var < 0) reads values",
    "mlp+AdaptiveLogSoftmaxWithLoss": "nonzero() reads values",
    # GRU's fused CUDA cell has no fake kernel: FakeTensor runs the real one, which needs CUDA.
    "gru": "_thnn_fused_gru_cell has no fake kernel",
}

if torch.backends.cudnn.is_available():
    # A CUDA build (torch 2.14.1's wheel) without a GPU: nn.LSTM on fake CUDA tensors takes cuDNN's
    # path, which asks the driver (AcceleratorError); a CPU build takes the fake-able one.
    NOT_ON_FAKE_CUDA["lstm"] = "a CUDA build's LSTM takes cuDNN, which needs a GPU"

MODEL_CASES = [
    _marked(f"{device}-{dname}-{name}", (device, dname, name))
    for device in DEVICES
    for dname in DTYPES
    for name in MODELS
    if device == "cpu" or name not in NOT_ON_FAKE_CUDA
]


@pytest.mark.parametrize("device,dname,name", MODEL_CASES)
def test_model_calls_below_autocast_match_native(device, dname, name):
    # Parameters require grad, as a model's do: the cast cache keeps their copies.
    model, inputs = build_model(name)
    params = dict(model.named_parameters()), dict(model.named_buffers())
    (calls, err), diff = compare(
        lambda p, *xs: functional_call(model, p, xs), inputs, {}, device, DTYPES[dname], params=params
    )
    assert diff is None, f"{name}: {diff}"
    # Where native raises (BCELoss, banned on CUDA; oneDNN's float16 LSTM on some CPUs), the region
    # raised alike after the same calls.
    assert calls, f"{name}: no call reached below autocast (native raised {err})"


def test_every_loss_in_torch_nn_has_a_model():
    assert sorted(set(_losses_in_torch()) - set(LOSSES)) == [], "add each to LOSSES"


# --- the recording sees the engine's calls ----------------------------------------------------------


@pytest.mark.skipif(_core.core is None, reason=f"engine: {_core.REASON}")
@pytest.mark.parametrize("device", sorted(DEVICES))
def test_the_core_decides_the_recorded_calls(device):
    # _trace's Note: the recording is a tensor subclass, not a dispatch mode, because the core
    # hands every call to the Python kernels while a mode is active. Here the core decides the
    # mm (the "decided" counter moves) and the recording sees what it called below.
    before = _core.core.counts()
    (calls, err), diff = compare(torch.mm, (torch.randn(2, 3), torch.randn(3, 4)), {}, device, torch.bfloat16)
    moved = {k: v - before[k] for k, v in _core.core.counts().items()}
    assert moved["decided"] >= 1 and moved["handed"] == 0, moved
    assert diff is None and err is None
    assert calls == [
        "aten._to_copy.default(f32[3, 4], dtype=torch.bfloat16)",
        "aten._to_copy.default(f32[2, 3], dtype=torch.bfloat16)",
        "aten.mm.default(bf16[2, 3], bf16[3, 4])",
    ]


def test_a_difference_is_found_and_said():
    # The comparison fails where it should: a sum that casts its float16 input first (as
    # torch-cuda's region did before fp32_set_opt_dtype) differs from one that does not, at the
    # first call, by the cast the trace shows.
    x = torch.randn(3, 4).half()
    want = trace(torch.sum, (x,), {}, "cpu", torch.float16, "native")
    got = trace(lambda t: torch.sum(t.float()), (x,), {}, "cpu", torch.float16, "native")
    assert want[0] != got[0]
    assert first_difference(want, got).startswith("call 0, at the first call:\n  native: ")
    assert first_difference(want, want) is None


#: An ATen op with a CUDA kernel and no fake one (no Meta kernel, no decomposition fake tensors use).
_REAL_ONLY = "_thnn_fused_gru_cell"


@pytest.mark.skipif(
    torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{_REAL_ONLY}", "Meta"),
    reason=f"this torch has a fake kernel for {_REAL_ONLY}",
)
def test_a_fake_cuda_trace_never_runs_a_real_kernel():
    # An op with no fake kernel raises on fake CUDA tensors before its CUDA kernel runs. Where a
    # GPU is, that kernel would write through the null pointers of the fake outputs _trace's
    # factories make: on an H200 that broke the CUDA context of 16 pytest workers (1326 later tests
    # failed). The CUDA kernel is replaced here by one that notes its call. Failed before: fake
    # tensors fell back to the real kernel.
    ran = []
    lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901  (undone below)
    try:
        lib.impl(_REAL_ONLY, lambda *args: ran.append(len(args)) or (args[0], args[0]), "CUDA")
        op = getattr(torch.ops.aten, _REAL_ONLY).default
        gates, hidden = torch.randn(3, 15), torch.randn(3, 5)
        outcomes = [
            trace(op, (gates, gates, hidden), {}, "cuda", torch.float16, which) for which in ("native", "region")
        ]
    finally:
        lib._destroy()
    assert ran == []
    assert [err for _, err in outcomes] == ["UnsupportedOperatorException"] * 2
