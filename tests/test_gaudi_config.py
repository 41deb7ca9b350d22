"""``policy_from_gaudi_config``: optimum-habana's ``gaudi_config.json`` as a policy.

The oracle is the route optimum-habana takes on Gaudi: ``GaudiConfig.declare_autocast_bf16_fp32_ops``
writes ``autocast_bf16_ops`` and ``autocast_fp32_ops`` one op a line to two files and points
``PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST`` and ``PT_HPU_AUTOCAST_FP32_OPS_LIST`` at them, which a
mode with the default policy reads (``policy_from_env``). ``_declare`` below does what it does
(optimum/habana/transformers/gaudi_configuration.py), into ``tmp_path`` rather than ``/tmp``.
"""

from __future__ import annotations

import json
import re
import warnings

import pytest
import torch

from hpu_autocast import CastPolicy, HpuAutocastMode, PolicyError, get_preset, policy_from_gaudi_config
from hpu_autocast.policies.builder import policy_from_bridge_files, policy_from_env, policy_from_files
from hpu_autocast.policies.gaudi import ENV_FP32, ENV_LOWER

# optimum-habana's DEFAULT_BF16_OPS and DEFAULT_FP32_OPS (BERT's lists), the lists its docs and
# examples' gaudi_config.json files carry.
OPTIMUM_BF16 = [
    "add",
    "addmm",
    "bmm",
    "div",
    "dropout",
    "gelu",
    "iadd",
    "linear",
    "layer_norm",
    "matmul",
    "mm",
    "rsub",
    "softmax",
    "truediv",
]
OPTIMUM_FP32 = ["embedding", "nll_loss", "log_softmax"]


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    # A name Gaudi ignores (iadd, truediv) warns once per process; each test starts afresh, and
    # with no PT_HPU_AUTOCAST_* variable of the environment the suite runs in.
    from hpu_autocast.policies import builder

    monkeypatch.setattr(builder, "_warned", set())
    for name in (ENV_LOWER, ENV_FP32, "LOWER_LIST", "FP32_LIST"):
        monkeypatch.delenv(name, raising=False)


def _config(tmp_path, data, name="gaudi_config.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data, indent=2))
    return str(path)


def _declare(tmp_path, config: dict, monkeypatch) -> tuple:
    """optimum-habana's declare_autocast_bf16_fp32_ops: both lists to files, the variables set."""
    lower, fp32 = tmp_path / "lower_list.txt", tmp_path / "fp32_list.txt"
    for path, ops in ((lower, config["autocast_bf16_ops"]), (fp32, config["autocast_fp32_ops"])):
        with path.open("w") as f:
            f.writelines(op + "\n" for op in ops)
    monkeypatch.setenv(ENV_LOWER, str(lower))
    monkeypatch.setenv(ENV_FP32, str(fp32))
    return str(lower), str(fp32)


def _quietly(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


LISTS = {
    "optimum-habana's defaults": (OPTIMUM_BF16, OPTIMUM_FP32),
    "aten spellings": (["aten::addmm", "mm.default", "aten.bmm"], ["aten::log_softmax.int", "exp"]),
    "empty lists": ([], []),
}


@pytest.mark.parametrize("bf16, fp32", LISTS.values(), ids=list(LISTS))
def test_a_config_is_the_policy_optimum_habanas_list_files_give(tmp_path, monkeypatch, bf16, fp32):
    config = {"use_torch_autocast": True, "use_fused_adam": True, "autocast_bf16_ops": bf16, "autocast_fp32_ops": fp32}
    path = _config(tmp_path, config)
    with warnings.catch_warnings(record=True) as direct_warnings:
        warnings.simplefilter("always")
        direct = policy_from_gaudi_config(path)
    assert _quietly(policy_from_gaudi_config, config) == direct  # the dict, as the file
    lower, fp32_file = _declare(tmp_path, config, monkeypatch)
    assert _quietly(policy_from_files, "hpu", lower=lower, fp32=fp32_file) == direct
    # Gaudi reads the files optimum-habana writes with ATen function names only; the aten
    # spellings are dropped there (gaudi's Note: list files as Gaudi's bridge reads them).
    on_gaudi = _quietly(policy_from_bridge_files, "hpu", lower=lower, fp32=fp32_file)
    assert _quietly(policy_from_env) == on_gaudi
    assert _quietly(HpuAutocastMode).policy == on_gaudi  # what a mode of the default policy runs
    assert (on_gaudi == direct) == all(re.fullmatch(r"\w+", n) for n in bf16 + fp32)
    assert direct != get_preset("hpu") and direct.name == "hpu+lists"
    # Gaudi ignores iadd and truediv (Python names); the direct route warns about them too.
    ignored = sorted({n for n in bf16 + fp32 if n in ("iadd", "truediv")})
    assert sorted(str(w.message).split("'")[1] for w in direct_warnings) == ignored
    assert all(f"{path}, key autocast_bf16_ops[" in str(w.message) for w in direct_warnings)


def test_the_lists_replace_the_hpu_presets():
    policy = _quietly(policy_from_gaudi_config, {"autocast_bf16_ops": OPTIMUM_BF16, "autocast_fp32_ops": OPTIMUM_FP32})
    assert policy.table[torch.ops.aten.gelu.default] is CastPolicy.LOWER  # on optimum's list, not on hpu's
    assert policy.table[torch.ops.aten.embedding.default] is CastPolicy.FP32
    # hpu's FP32 list is replaced: acos leaves the table; exp, on hpu's promote list too, promotes.
    assert torch.ops.aten.acos.default not in policy.table
    assert policy.table[torch.ops.aten.exp.default] is CastPolicy.PROMOTE
    x = torch.randn(4, 8)
    with HpuAutocastMode(policy=policy, device_type="cpu"):
        assert torch.nn.functional.gelu(x).dtype == torch.bfloat16
        assert torch.exp(x.bfloat16()).dtype == torch.bfloat16
    with HpuAutocastMode(policy="hpu", device_type="cpu"):
        assert torch.nn.functional.gelu(x).dtype == torch.float32
        assert torch.exp(x.bfloat16()).dtype == torch.float32


def test_the_environment_does_not_change_the_direct_route(tmp_path, monkeypatch):
    config = {"autocast_bf16_ops": ["mm"], "autocast_fp32_ops": ["exp"]}
    before = policy_from_gaudi_config(config)
    (tmp_path / "other.txt").write_text("bmm\n")
    monkeypatch.setenv(ENV_LOWER, str(tmp_path / "other.txt"))
    assert policy_from_gaudi_config(config) == before != policy_from_env()


def test_a_directory_is_read_as_from_pretrained_reads_it(tmp_path):
    config = {"autocast_bf16_ops": ["mm"], "autocast_fp32_ops": ["exp"]}
    _config(tmp_path, config)
    assert policy_from_gaudi_config(tmp_path) == policy_from_gaudi_config(str(tmp_path / "gaudi_config.json"))


@pytest.mark.parametrize(
    "config", [{}, {"use_torch_autocast": True}, {"autocast_bf16_ops": None, "autocast_fp32_ops": None}]
)
def test_no_lists_is_the_hpu_preset(config):
    # GaudiConfig's lists default to None: optimum-habana sets no variable, Gaudi runs its own lists.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert policy_from_gaudi_config(config) == get_preset("hpu")


@pytest.mark.parametrize(
    "given, missing", [("autocast_bf16_ops", "autocast_fp32_ops"), ("autocast_fp32_ops", "autocast_bf16_ops")]
)
def test_one_list_alone_is_left_out_with_a_warning_as_optimum_habana_leaves_it(tmp_path, given, missing):
    path = _config(tmp_path, {given: ["mm"]})
    with pytest.warns(UserWarning) as record:
        policy = policy_from_gaudi_config(path)
    assert policy == get_preset("hpu")
    assert [str(w.message) for w in record] == [
        f"Gaudi configuration {path!r} gives {given} but not {missing}; optimum-habana sets autocast's lists only "
        f"when both are given, so neither applies and the policy is the 'hpu' preset's. Give both lists (to keep "
        f"one of the preset's, copy its names: hpu-autocast policy --preset hpu)."
    ]


# --- errors name the op and where it came from, as the list-file route's do ----------------------------


def test_an_unknown_op_is_named_with_its_file_and_key_as_a_list_files_line(tmp_path):
    bf16 = ["add", "mm", "bmm", "mmm"]
    path = _config(tmp_path, {"autocast_bf16_ops": bf16, "autocast_fp32_ops": ["exp"]})
    with pytest.raises(PolicyError) as direct:
        policy_from_gaudi_config(path)
    lower = tmp_path / "lower.txt"
    lower.write_text("".join(op + "\n" for op in bf16))
    with pytest.raises(PolicyError) as from_file:
        policy_from_files("hpu", lower=lower)
    # The same error, with the JSON key where the file has its line.
    assert str(direct.value) == str(from_file.value).replace(
        f"({lower}, line 4)", f"({path}, key autocast_bf16_ops[3])"
    )
    assert str(direct.value).startswith(f"unknown op 'mmm' ({path}, key autocast_bf16_ops[3]); closest valid names: mm")


def test_an_unknown_op_of_a_dict_is_named_with_its_key():
    with pytest.raises(
        PolicyError,
        match=r"^unknown op 'softmaxx' \(dict key autocast_fp32_ops\[1\]\); "
        r"closest valid names: softmax",
    ):
        policy_from_gaudi_config({"autocast_bf16_ops": ["mm"], "autocast_fp32_ops": ["exp", "softmaxx"]})


def test_an_op_on_both_lists_names_both_keys(tmp_path):
    path = _config(tmp_path, {"autocast_bf16_ops": ["add", "mm"], "autocast_fp32_ops": ["exp", "mm"]})
    with pytest.raises(PolicyError) as err:
        policy_from_gaudi_config(path)
    assert str(err.value).startswith(
        f"aten.mm.default is on both the lower-precision list, as 'mm' ({path}, key autocast_bf16_ops[1]), "
        f"and the FP32 list, as 'mm' ({path}, key autocast_fp32_ops[1]); remove it from one"
    )


@pytest.mark.parametrize(
    "value, message",
    [
        ("mm", "autocast_bf16_ops must be a list of op names (or null), got 'mm' (str)"),
        ({"mm": 1}, "autocast_bf16_ops must be a list of op names (or null), got {'mm': 1} (dict)"),
        (["mm", 3], "autocast_bf16_ops[1] is 3 (int), not an op name"),
        (["mm", None], "autocast_bf16_ops[1] is None (NoneType), not an op name"),
    ],
)
def test_a_list_of_the_wrong_type_is_named(tmp_path, value, message):
    config = {"autocast_bf16_ops": value, "autocast_fp32_ops": []}
    path = _config(tmp_path, config)
    with pytest.raises(PolicyError) as err:
        policy_from_gaudi_config(path)
    assert str(err.value) == f"Gaudi configuration {path!r}: {message}"
    with pytest.raises(PolicyError) as err:
        policy_from_gaudi_config(config)
    assert str(err.value) == f"Gaudi configuration dict: {message}"


def test_malformed_json_is_named_with_its_line_and_column(tmp_path):
    path = tmp_path / "gaudi_config.json"
    path.write_text('{\n  "autocast_bf16_ops": ["mm",]\n}\n')
    # (json's own words for it differ between Python versions)
    with pytest.raises(
        PolicyError,
        match=rf"^Gaudi configuration {re.escape(repr(str(path)))} is not valid JSON: "
        r".+ \(line 2, column 30\)$",
    ):
        policy_from_gaudi_config(path)


def test_json_that_is_not_an_object(tmp_path):
    path = _config(tmp_path, ["mm"])
    with pytest.raises(PolicyError, match=r"holds a JSON list, not an object such as \{\"autocast_bf16_ops\""):
        policy_from_gaudi_config(path)


def test_missing_files(tmp_path):
    with pytest.raises(PolicyError) as err:
        policy_from_gaudi_config(tmp_path / "nope.json")
    assert str(err.value) == f"Gaudi configuration {str(tmp_path / 'nope.json')!r} does not exist"
    # A directory without one: the file from_pretrained would read is named.
    with pytest.raises(PolicyError) as err:
        policy_from_gaudi_config(tmp_path)
    assert str(err.value) == f"Gaudi configuration {str(tmp_path / 'gaudi_config.json')!r} does not exist"


def test_a_file_that_is_not_text(tmp_path):
    path = tmp_path / "gaudi_config.json"
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(PolicyError, match="is not UTF-8 text"):
        policy_from_gaudi_config(path)


@pytest.mark.parametrize("config", [3, None, ["gaudi_config.json"], b"gaudi_config.json"])
def test_an_argument_that_is_neither_a_path_nor_a_dict(config):
    with pytest.raises(
        TypeError,
        match=r"^policy_from_gaudi_config takes the path of a gaudi_config.json \(or of "
        rf"the directory holding one\) or its contents as a dict, got {type(config).__name__}$",
    ):
        policy_from_gaudi_config(config)


# --- older configurations, misspelt keys, use_torch_autocast (issue 31, item 6) ------------------


def _hmp_files(tmp_path, bf16, fp32) -> tuple:
    """An older GaudiTrainer's route: write_bf16_fp32_ops_to_text_files, then hmp.convert's files."""
    lower, f32 = tmp_path / "hmp_bf16.txt", tmp_path / "hmp_fp32.txt"
    for path, ops in ((lower, bf16), (f32, fp32)):
        with path.open("w") as f:
            f.writelines(op + "\n" for op in ops)
    return str(lower), str(f32)


@pytest.mark.parametrize(
    "lists",
    [{"hmp_bf16_ops": ["mm", "bmm"], "hmp_fp32_ops": ["softmax"]}, {}],
    ids=["given", "optimum-habana's defaults"],
)
def test_an_older_hmp_config_is_the_policy_hmp_convert_ran(tmp_path, lists):
    # Failed before: the plain hpu preset. GaudiConfig's hmp_bf16_ops/hmp_fp32_ops default to
    # DEFAULT_BF16_OPS/DEFAULT_FP32_OPS, written to files hmp.convert(opt_level="O1") reads.
    config = {"use_habana_mixed_precision": True, "hmp_is_verbose": False, **lists}
    files = _hmp_files(tmp_path, lists.get("hmp_bf16_ops", OPTIMUM_BF16), lists.get("hmp_fp32_ops", OPTIMUM_FP32))
    expected = _quietly(policy_from_files, "hmp", lower=files[0], fp32=files[1])
    got = _quietly(policy_from_gaudi_config, _config(tmp_path, config))
    assert got == expected and got != get_preset("hpu")
    assert got.unlisted == get_preset("hmp").unlisted  # HMP's defaults for ops on no list kept


def test_an_older_hmp_config_at_o2_is_hmp_o2():
    config = {"use_habana_mixed_precision": True, "hmp_opt_level": "O2", "hmp_bf16_ops": ["mm"]}
    assert policy_from_gaudi_config(config) == get_preset("hmp-O2")
    with pytest.raises(PolicyError, match=r"hmp_opt_level must be \"O1\" or \"O2\", got 'O3'"):
        policy_from_gaudi_config({"use_habana_mixed_precision": True, "hmp_opt_level": "O3"})


def test_hmp_and_autocast_both_on_is_refused_as_gaudi_config_refuses_it():
    with pytest.raises(PolicyError, match="use_habana_mixed_precision and use_torch_autocast are both true"):
        policy_from_gaudi_config({"use_habana_mixed_precision": True, "use_torch_autocast": True})


@pytest.mark.parametrize(
    "key, near",
    [
        ("autocast_bf16_op", "autocast_bf16_ops"),
        ("use_torch_autocat", "use_torch_autocast"),
        ("hmp_fp32", "hmp_fp32_ops"),
    ],
)
def test_a_misspelt_key_is_named_with_the_nearest_known_one(key, near):
    # Failed before: ignored silently (optimum-habana keeps it unread too), so the misspelt list
    # left Gaudi's defaults in force. A warning: optimum-habana does not refuse it either.
    with pytest.warns(
        UserWarning,
        match=rf"unknown key '{key}', ignored .*did you mean '{near}'\? the keys read are "
        r"autocast_bf16_ops, autocast_fp32_ops, hmp_bf16_ops",
    ):
        policy_from_gaudi_config({key: ["mm"], "optimum_version": "1.0", "transformers_version": "4.0"})


def test_use_torch_autocast_false_is_a_policy_that_casts_nothing():
    # Failed before: the hpu preset, which lowers mm. optimum-habana runs no autocast then.
    policy = policy_from_gaudi_config(
        {"use_torch_autocast": False, "autocast_bf16_ops": ["mm"], "autocast_fp32_ops": []}
    )
    assert dict(policy.table) == {}
    a = torch.randn(3, 3)
    with HpuAutocastMode(torch.bfloat16, policy=policy, device_type="cpu"):
        out = torch.mm(a, a) + 1
    assert out.dtype == torch.float32 and torch.equal(out, torch.mm(a, a) + 1)
