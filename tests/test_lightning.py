"""``HpuAutocastPrecision``, the PyTorch Lightning plugin, with a real ``Trainer`` on CPU.

The oracle is Lightning's own ``MixedPrecision`` (what ``precision="bf16-mixed"`` builds): under
the ``torch-cpu`` preset, whose table is exactly what ``torch.autocast("cpu")`` registers, the
same seed and data must give the same weights, predictions and loss-scale history bit for bit.

Skipped where ``pytorch-lightning`` (the ``lightning`` extra) is not installed. The import
boundary (the package never imports Lightning; the plugin's module says what is missing) is
tested in ``tests/test_public_api.py``, which runs without Lightning.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import math
import os
import re
import runpy

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("pytorch_lightning")

import hpu_autocast  # noqa: E402
from hpu_autocast import PolicyError, Recorder, get_preset  # noqa: E402
from hpu_autocast.integrations.lightning import (  # noqa: E402
    LIGHTNING,
    HpuAutocastFabricPrecision,
    HpuAutocastPrecision,
    MixedPrecision,
)

# The Trainer and Fabric of the package the plugins subclass: `lightning` where it is installed beside
# pytorch-lightning (a GPU machine's image has both), as a user's Trainer must be.
pl = importlib.import_module("lightning.pytorch" if LIGHTNING == "lightning" else "pytorch_lightning")
fabric_package = importlib.import_module("lightning.fabric" if LIGHTNING == "lightning" else "lightning_fabric")
MisconfigurationException = importlib.import_module(f"{pl.__name__}.utilities.exceptions").MisconfigurationException

# Lightning 2.6 builds torch.utils._pytree.LeafSpec, which torch 2.13 deprecates: noise from
# between the two, not from the plugin.
pytestmark = pytest.mark.filterwarnings(r"ignore:.isinstance\(treespec, LeafSpec\). is deprecated:FutureWarning")

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")
STEPS = 4


class Classifier(pl.LightningModule):
    """A two-layer classifier that notes, in each step, the region in force and the dtype of the
    network's output, and whether a region is open around backward and the optimizer step."""

    def __init__(self, manual: bool = False) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
        self.automatic_optimization = not manual
        self.seen = collections.defaultdict(list)

    def _forward(self, kind: str, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        self.seen[kind].append((hpu_autocast.get_dtype(), out.dtype))
        return out

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.automatic_optimization:
            return F.cross_entropy(self._forward("train", x), y)
        # Two updates in one step context: the second forward must see the first update.
        opt = self.optimizers()
        for _ in range(2):
            loss = F.cross_entropy(self._forward("train", x), y)
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self._forward("validation", x), y)

    def test_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self._forward("test", x), y)

    def predict_step(self, batch, batch_idx):
        return self._forward("predict", batch[0])

    def on_before_backward(self, loss):
        self.seen["backward"].append(hpu_autocast.is_enabled())

    def on_before_optimizer_step(self, optimizer):
        self.seen["optimizer step"].append(hpu_autocast.is_enabled())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


class Scales(pl.Callback):
    """The loss scale after each training batch (float16 runs)."""

    def __init__(self) -> None:
        self.history = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.history.append(trainer.precision_plugin.scaler.get_scale())


def _loader(n: int = 32, seed: int = 1) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(seed)
    data = torch.utils.data.TensorDataset(torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g))
    return torch.utils.data.DataLoader(data, batch_size=8)


def _trainer(**kwargs) -> "pl.Trainer":
    settings = dict(
        accelerator="cpu",
        devices=1,
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=2,
    )
    return pl.Trainer(**{**settings, **kwargs})


def _run(manual: bool = False, evaluate: bool = True, **trainer_kwargs):
    """Fit (with validation), then test and predict unless ``evaluate`` is false; the model, the
    predictions and the trainer."""
    pl.seed_everything(0, verbose=False)
    model = Classifier(manual)
    trainer = _trainer(**trainer_kwargs)
    trainer.fit(model, _loader(), _loader(seed=2))
    if not evaluate:
        return model, None, trainer
    trainer.test(model, _loader(seed=3), verbose=False)
    predictions = trainer.predict(model, _loader(seed=4))
    return model, predictions, trainer


def _same_weights(a: Classifier, b: Classifier) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# --- bfloat16: parity with precision="bf16-mixed" --------------------------------------------------


@pytest.fixture(scope="module")
def bf16_runs():
    ours = _run(plugins=[HpuAutocastPrecision("bf16-mixed", policy="torch-cpu")])  # Lightning's string
    native = _run(precision="bf16-mixed")
    return ours, native


def test_bf16_fit_matches_lightning_bf16_mixed(bf16_runs):
    (ours, ours_pred, trainer), (native, native_pred, native_trainer) = bf16_runs
    assert type(native_trainer.precision_plugin) is MixedPrecision  # the oracle is Lightning's plugin
    assert trainer.precision == native_trainer.precision == "bf16-mixed"
    assert trainer.global_step == native_trainer.global_step == STEPS
    assert _same_weights(ours, native)
    assert len(ours_pred) == len(native_pred) == 4
    assert all(torch.equal(a, b) for a, b in zip(ours_pred, native_pred))
    # The region changes the run: in float32 the weights differ.
    plain, _, _ = _run()
    assert not _same_weights(ours, plain)


@pytest.mark.parametrize("kind", ["train", "validation", "test", "predict"])
def test_every_step_runs_in_the_region(bf16_runs, kind):
    (ours, _, _), (native, _, _) = bf16_runs
    # Each step's forward: inside our region (get_dtype), the linear's output in bfloat16.
    assert ours.seen[kind] and set(ours.seen[kind]) == {(torch.bfloat16, torch.bfloat16)}
    # Lightning's own plugin runs torch.autocast: bfloat16 outputs, but no region of ours.
    assert set(native.seen[kind]) == {(None, torch.bfloat16)}


def test_backward_and_the_optimizer_step_run_outside_the_region(bf16_runs):
    (ours, _, _), _ = bf16_runs
    assert ours.seen["backward"] == [False] * STEPS
    assert ours.seen["optimizer step"] == [False] * STEPS


def test_manual_optimization_matches_and_needs_the_cache_off():
    # Lightning's MixedPrecision turns autocast's cast cache off, and so does the plugin: here a
    # step updates the weights and runs forward again in one step context.
    ours, _, _ = _run(manual=True, evaluate=False, plugins=[HpuAutocastPrecision(torch.bfloat16, policy="torch-cpu")])
    native, _, _ = _run(manual=True, evaluate=False, precision="bf16-mixed")
    assert _same_weights(ours, native)
    # The control: with the cache on, the second forward reuses casts of the weights as they were.
    cached, _, _ = _run(
        manual=True,
        evaluate=False,
        plugins=[HpuAutocastPrecision(torch.bfloat16, policy="torch-cpu", cache_enabled=True)],
    )
    assert not _same_weights(cached, native)


# --- the hpu preset ------------------------------------------------------------------------------


def test_training_under_the_hpu_preset():
    recorder = Recorder("hpu", torch.bfloat16)
    pl.seed_everything(0, verbose=False)
    model = Classifier()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = _trainer(plugins=[HpuAutocastPrecision(observer=recorder, device_type="cpu")])  # bfloat16, policy "hpu"
    trainer.fit(model, _loader(), _loader(seed=2))
    assert trainer.global_step == STEPS and trainer.precision == "bf16-mixed"
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())  # it trained
    assert all(v.dtype == torch.float32 for v in model.state_dict().values())  # float32 master weights
    assert set(model.seen["train"]) == {(torch.bfloat16, torch.bfloat16)}
    # The observer saw every forward's two linears run in bfloat16 (Gaudi's lower list).
    forwards = len(model.seen["train"]) + len(model.seen["validation"])
    linear = recorder.report().by_op()["aten.linear.default"]
    assert linear["by_action"] == {"lower": 2 * forwards}
    # The first takes the float32 batch; the second, GELU's output of the first, in bfloat16.
    assert linear["by_dtypes"] == {"f32,f32,f32 -> bf16": forwards, "bf16,f32,f32 -> bf16": forwards}


def test_hpu_preset_reads_gaudis_list_variables_per_step(tmp_path, monkeypatch):
    # Under the default preset each step's region reads PT_HPU_AUTOCAST_*: with linear moved to
    # the FP32 list, the steps' outputs are float32. (Both files: as on Gaudi, the lower list
    # is tried first, so an FP32 file alone leaves linear, default lower, in bfloat16.)
    (tmp_path / "fp32.txt").write_text("linear\n")
    (tmp_path / "lower.txt").write_text("mm\n")
    monkeypatch.setenv("PT_HPU_AUTOCAST_FP32_OPS_LIST", str(tmp_path / "fp32.txt"))
    monkeypatch.setenv("PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST", str(tmp_path / "lower.txt"))
    pl.seed_everything(0, verbose=False)
    model = Classifier()
    _trainer(plugins=[HpuAutocastPrecision(device_type="cpu")]).fit(model, _loader(), _loader(seed=2))
    assert set(model.seen["train"]) == {(torch.bfloat16, torch.float32)}


# --- float16: Lightning's loss scaling -----------------------------------------------------------


def _fp16_run(plugin):
    scales = Scales()
    model, predictions, trainer = _run(plugins=[plugin], callbacks=[scales], max_steps=8)
    return model, predictions, trainer, scales.history


def _scaler():
    # A scale near where this model's float16 gradients overflow (such a step is skipped and the
    # scale halves) and growth after every 2 good steps: the history moves both ways in 8 steps.
    return torch.amp.GradScaler("cpu", init_scale=2.0**18, growth_interval=2)


def test_float16_fit_matches_lightning_16_mixed():
    # Trainer(precision="16-mixed") on CPU falls back to bf16-mixed (Lightning warns), so the
    # oracle is Lightning's MixedPrecision("16-mixed", "cpu") given as a plugin, with the same scaler.
    ours, ours_pred, trainer, ours_scales = _fp16_run(
        HpuAutocastPrecision(torch.float16, policy="torch-cpu", scaler=_scaler())
    )
    native, native_pred, _, native_scales = _fp16_run(MixedPrecision("16-mixed", "cpu", scaler=_scaler()))
    assert trainer.precision == "16-mixed"
    assert ours_scales == native_scales
    moves = list(zip(ours_scales, ours_scales[1:]))
    assert any(b < a for a, b in moves) and any(b > a for a, b in moves)  # steps skipped, and grown
    assert _same_weights(ours, native)
    assert all(torch.equal(a, b) for a, b in zip(ours_pred, native_pred))
    assert set(ours.seen["train"]) == {(torch.float16, torch.float16)}


def test_float16_gets_a_scaler_and_its_state_in_checkpoints():
    plugin = HpuAutocastPrecision(torch.float16, policy="torch-cpu")
    assert isinstance(plugin.scaler, torch.amp.GradScaler) and plugin.scaler.is_enabled()
    assert plugin.state_dict().keys() == {
        "scale",
        "growth_factor",
        "backoff_factor",
        "growth_interval",
        "_growth_tracker",
    }
    assert HpuAutocastPrecision(torch.bfloat16, policy="torch-cpu").scaler is None


# --- bad settings fail when the plugin is made ------------------------------------------------------


def test_bad_settings_are_refused_at_once():
    with pytest.raises(
        ValueError,
        match=r"dtype must be torch.bfloat16 or torch.float16, or Lightning's precision "
        r"\"bf16-mixed\" or \"16-mixed\" \(older spellings: \"bf16\", \"16\", 16\), "
        r"got torch.float32",
    ):
        HpuAutocastPrecision(torch.float32)
    for bad in ("32-true", "bf16-true", 32, True):
        with pytest.raises(ValueError, match=f"got {bad!r}"):
            HpuAutocastPrecision(bad)
    with pytest.raises(ValueError, match="bfloat16"):  # a bfloat16-only policy refuses float16
        HpuAutocastPrecision(torch.float16, policy=dataclasses.replace(get_preset("hpu"), dtypes=(torch.bfloat16,)))
    with pytest.raises((PolicyError, KeyError, ValueError), match="no-such-preset"):
        HpuAutocastPrecision(policy="no-such-preset")
    with pytest.raises(MisconfigurationException, match="does not use a scaler"):
        HpuAutocastPrecision(torch.bfloat16, policy="torch-cpu", scaler=torch.amp.GradScaler("cpu"))
    with pytest.raises(TypeError, match="observer=hpu_autocast.Recorder"):
        HpuAutocastPrecision(record=True)
    with pytest.raises(TypeError, match="no_such_setting"):
        HpuAutocastPrecision(no_such_setting=1)


def test_on_gaudi_the_region_is_for_hpu_tensors_and_bfloat16_only(monkeypatch):
    import _fake_habana

    _fake_habana.install(monkeypatch)  # the bridge is loaded: this process runs on Gaudi
    plugin = HpuAutocastPrecision()
    mode = plugin.autocast_context_manager()
    assert plugin.device == mode.device_type == "hpu" and plugin.scaler is None
    assert mode.cache_enabled is False and mode is not plugin.autocast_context_manager()  # one per step
    with pytest.raises(ValueError, match="dtype=float16 is not supported on a first-generation Gaudi"):
        HpuAutocastPrecision(torch.float16, policy="torch-cpu", device_type="hpu")
    # The device's rules follow the region's device: a torch-cpu region casts CPU tensors.
    assert HpuAutocastPrecision(torch.float16, policy="torch-cpu").device == "cpu"


def test_the_plugin_names_its_settings():
    assert (
        repr(HpuAutocastPrecision(policy="torch-cpu"))
        == "HpuAutocastPrecision(dtype=torch.bfloat16, policy='torch-cpu')"
    )


# --- the example -------------------------------------------------------------------------------------


def test_lightning_example_runs(capsys):
    example = runpy.run_path(os.path.join(EXAMPLES, "lightning_example.py"), run_name="example")
    losses = example["main"](["--steps", "3"])
    out = capsys.readouterr().out
    printed = [float(x) for x in re.findall(r"^step \d+: loss (\S+)$", out, flags=re.M)]
    assert len(losses) == len(printed) == 3 and all(math.isfinite(x) for x in losses)
    assert printed == [round(x, 4) for x in losses]
    # Its validation pass ran in the plugin's region, with the default bfloat16 and policy.
    assert re.search(
        r"^validation: loss \S+, logits torch.bfloat16 \(region: policy hpu, torch.bfloat16\)$", out, flags=re.M
    )


# --- Lightning's precision strings, both packages, Fabric (issue 31, item 8) --------------------------


@pytest.mark.parametrize(
    "args, kwargs, dtype",
    [
        (("bf16-mixed",), {}, torch.bfloat16),
        (("16-mixed",), {}, torch.float16),
        (("bf16",), {}, torch.bfloat16),
        ((16,), {}, torch.float16),
        ((), {"precision": "bf16-mixed"}, torch.bfloat16),
        ((), {"precision": "16-mixed"}, torch.float16),
        ((torch.float16,), {"precision": "16-mixed"}, torch.float16),
        ((), {}, torch.bfloat16),
    ],
    ids=str,
)
def test_lightnings_precision_strings_are_taken_as_lightning_takes_them(args, kwargs, dtype):
    # Failed before: only a torch.dtype (lightning-habana's users write precision="bf16-mixed").
    plugin = HpuAutocastPrecision(*args, policy="torch-cpu", **kwargs)
    assert plugin.dtype == plugin.autocast_context_manager().dtype == dtype
    assert plugin.precision == {torch.bfloat16: "bf16-mixed", torch.float16: "16-mixed"}[dtype]
    assert (plugin.scaler is not None) is (dtype == torch.float16)


def test_a_dtype_and_a_precision_that_disagree_are_refused():
    with pytest.raises(TypeError, match=r"dtype=torch.bfloat16 and precision='16-mixed' disagree"):
        HpuAutocastPrecision(torch.bfloat16, precision="16-mixed", policy="torch-cpu")


def _load_plugin_module(monkeypatch, stand_in: bool):
    """A fresh copy of the plugins' module, with a stand-in ``lightning`` package installed (or
    ``lightning`` missing): the module chooses its package when imported."""
    import importlib.util
    import sys
    import types

    if stand_in:
        bases = {}
        for name in (
            "lightning",
            "lightning.pytorch",
            "lightning.pytorch.plugins",
            "lightning.pytorch.plugins.precision",
            "lightning.fabric",
            "lightning.fabric.plugins",
            "lightning.fabric.plugins.precision",
        ):
            module = types.ModuleType(name)
            if name.endswith("precision"):
                bases[name] = module.MixedPrecision = type("MixedPrecision", (), {"__module__": name})
            monkeypatch.setitem(sys.modules, name, module)
    else:  # not installed: its submodules too, where it is and they are imported already
        for name in [m for m in sys.modules if m.partition(".")[0] == "lightning"] or ["lightning"]:
            monkeypatch.setitem(sys.modules, name, None)
    path = hpu_autocast.integrations.lightning.__file__
    spec = importlib.util.spec_from_file_location("hpu_autocast.integrations._lightning_probe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, (bases if stand_in else None)


def test_the_plugins_come_from_lightning_where_it_is_installed(monkeypatch):
    # Failed before: pytorch_lightning's only, which a lightning.Trainer refuses.
    module, bases = _load_plugin_module(monkeypatch, stand_in=True)
    assert module.LIGHTNING == "lightning"
    assert module.HpuAutocastPrecision.__mro__[2] is bases["lightning.pytorch.plugins.precision"]
    assert module.HpuAutocastFabricPrecision.__mro__[2] is bases["lightning.fabric.plugins.precision"]


def test_the_plugins_come_from_pytorch_lightning_without_lightning(monkeypatch):
    import lightning_fabric.plugins.precision as fabric_precision
    import pytorch_lightning.plugins.precision as trainer_precision

    module, _ = _load_plugin_module(monkeypatch, stand_in=False)
    assert module.LIGHTNING == "pytorch_lightning"
    assert issubclass(module.HpuAutocastPrecision, trainer_precision.MixedPrecision)
    assert issubclass(module.HpuAutocastFabricPrecision, fabric_precision.MixedPrecision)


def _fabric_fit(**fabric_kwargs):
    """A few Fabric training steps; the weights and, per forward, the region's dtype and the output's."""
    fabric = fabric_package.Fabric(accelerator="cpu", devices=1, **fabric_kwargs)
    pl.seed_everything(0, verbose=False)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    seen = []
    net.register_forward_hook(lambda m, i, out: seen.append((hpu_autocast.get_dtype(), out.dtype)))
    model, opt = fabric.setup(net, torch.optim.SGD(net.parameters(), lr=0.5))
    for x, y in _loader():
        loss = F.cross_entropy(model(x), y)
        fabric.backward(loss)
        opt.step()
        opt.zero_grad()
    return net.state_dict(), seen


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_the_fabric_plugin_trains_as_fabrics_own_mixed_precision(precision):
    ours, seen = _fabric_fit(plugins=[HpuAutocastFabricPrecision(precision, policy="torch-cpu")])
    # The oracle is Fabric's own MixedPrecision (Fabric(precision="16-mixed") on CPU switches to
    # bf16-mixed, so the plugin is given directly).
    from hpu_autocast.integrations.lightning import FabricMixedPrecision

    native, native_seen = _fabric_fit(plugins=[FabricMixedPrecision(precision, device="cpu")])
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}[precision]
    assert seen == [(dtype, dtype)] * 4 and [d for _, d in native_seen] == [dtype] * 4
    assert ours.keys() == native.keys() and all(torch.equal(ours[k], native[k]) for k in ours)
    assert not hpu_autocast.is_enabled()


class Logs(pl.LightningModule):
    """Logs a value bfloat16 cannot hold (1 + 2**-10 + 1e-4) as an epoch metric in each step."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(16, 4)

    def training_step(self, batch, batch_idx):
        self.log("value", torch.tensor(1 + 2**-10 + 1e-4), on_step=False, on_epoch=True)
        return self.net(batch[0]).float().sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


@pytest.mark.parametrize("policy", ["hpu", "torch-cpu"])
def test_values_logged_in_a_step_follow_the_policy(policy):
    # docs/migration.md: Lightning accumulates an epoch metric (mean, then a mul by the batch
    # size) inside the step's region; hpu lowers both, torch-cpu neither.
    trainer = _trainer(max_steps=-1, max_epochs=1, plugins=[HpuAutocastPrecision(policy=policy, device_type="cpu")])
    trainer.fit(Logs(), _loader())
    value = trainer.callback_metrics["value"]
    exact = torch.tensor(1 + 2**-10 + 1e-4)
    assert value.dtype == torch.float32
    if policy == "hpu":
        assert value.item() == exact.bfloat16().item() != exact.item()
    else:
        assert value.item() == pytest.approx(exact.item(), rel=1e-6)
