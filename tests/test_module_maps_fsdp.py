"""Module maps on an FSDP2 model (``torch.distributed.fsdp.fully_shard``; docs/modules.md, FSDP2).

FSDP2 runs on CPU with the gloo backend and a CPU ``DeviceMesh``; one rank in this process
(a ``HashStore``, no port, no spawn) keeps it cheap. With one rank each shard is the whole
parameter, but everything a map meets is there: the modules' class is FSDP2's (``FSDPLinear``),
their parameters are ``DTensor``s gathered by FSDP2's own forward pre-hooks and freed by its
post-hooks, gradients are reduce-scattered. The oracle is the same model unsharded, under the
same map, bit for bit."""

import pytest
import torch
import torch.nn.functional as F

from hpu_autocast import HpuAutocastMode

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)
try:
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard  # torch >= 2.6
except ImportError:  # pragma: no cover - torch 2.4-2.5
    fsdp2 = pytest.importorskip("torch.distributed._composable.fsdp")
    FSDPModule, MixedPrecisionPolicy, fully_shard = fsdp2.FSDPModule, fsdp2.MixedPrecisionPolicy, fsdp2.fully_shard
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

MAP = {"2": torch.float32}  # the middle Linear in float32, the rest of the region in bfloat16


@pytest.fixture(scope="module")
def mesh():
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def tiny():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)
    )


def shard(model, mesh, param_dtype=None, own=None):
    """``fully_shard`` each layer, then the root (FSDP2's usual order); layer 2 with ``own`` as its
    ``param_dtype`` where given."""
    for i, layer in enumerate(model):
        dtype = own if (i == 2 and own is not None) else param_dtype
        fully_shard(layer, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=dtype))
    fully_shard(model, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=param_dtype))
    return model


def step(model, steps=2):
    """``steps`` SGD steps in a bf16 region under ``MAP``; the losses, the last gradients (whole
    tensors) and the output dtype of each layer at the first step."""
    torch.manual_seed(1)
    xs, ys = torch.randn(steps, 4, 8), torch.randn(steps, 4, 4)
    seen = {}
    hooks = [
        layer.register_forward_hook(lambda m, a, out, n=n: seen.setdefault(n, out.dtype) and None)
        for n, layer in model.named_children()
    ]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, y in zip(xs, ys):
        with HpuAutocastMode(torch.bfloat16, device_type="cpu", modules=MAP, record=True) as mode:
            loss = F.mse_loss(model(x).float(), y)
        opt.zero_grad()
        loss.backward()
        grads = [p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad for p in model.parameters()]
        opt.step()
        losses.append(loss.detach())
    for h in hooks:
        h.remove()
    return losses, grads, seen, mode.report()


def test_fsdp2_model_under_a_map_equals_the_unsharded_one_bit_for_bit(mesh):
    sharded = shard(tiny(), mesh)
    assert isinstance(sharded[2], FSDPModule) and isinstance(sharded, FSDPModule)
    # FSDP2 changes the modules' class and adds hooks; no wrapper module: the names are the model's.
    assert [n for n, _ in sharded.named_modules()] == ["", "0", "1", "2", "3"]
    got, want = step(sharded), step(tiny())
    assert all(torch.equal(a, b) for a, b in zip(got[0], want[0]))  # each step's loss
    assert all(torch.equal(a, b) for a, b in zip(got[1], want[1]))  # the gradients, gathered
    # the mapped layer computed in float32, the others in bfloat16, in both
    assert got[2] == want[2] == {"0": torch.bfloat16, "1": torch.bfloat16, "2": torch.float32, "3": torch.bfloat16}
    assert got[3].modules == {"2": {"override": "float32", "forwards": 1, "calls": {}}}  # the report's last step


def test_fsdp2_param_dtype_lower_than_a_float32_module_is_refused(mesh):
    # fully_shard(..., MixedPrecisionPolicy(param_dtype=bf16)) casts layer 2's parameters and
    # inputs to bf16 after the map's hook cast them up: it would run in bf16 with no word.
    model = shard(tiny(), mesh, param_dtype=torch.bfloat16)
    with pytest.raises(
        ValueError,
        match=r"'2' maps module '2' to float32, but FSDP2 gathers its parameters in "
        r"bfloat16 \(fully_shard\('2', mp_policy=.*param_dtype=torch.float32",
    ):
        with HpuAutocastMode(torch.bfloat16, device_type="cpu", modules=MAP):
            model(torch.randn(4, 8))


def test_fsdp2_float32_param_dtype_of_its_own_makes_the_module_float32(mesh):
    # The fix the error names: layer 2 sharded with a float32 policy of its own, the rest bf16.
    # FSDP2's casts then agree with the region's: the same loss as the unsharded model under the
    # map, bit for bit. (The bf16 layers' gradients are FSDP2's, taken against its bf16 copies;
    # they may differ from the region's in the last bits, so only the loss is compared here.)
    got = step(shard(tiny(), mesh, param_dtype=torch.bfloat16, own=torch.float32), steps=1)
    want = step(tiny(), steps=1)
    assert torch.equal(got[0][0], want[0][0])
    assert got[2] == want[2] == {"0": torch.bfloat16, "1": torch.bfloat16, "2": torch.float32, "3": torch.bfloat16}
