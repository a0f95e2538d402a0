"""The KV-dtype rules, one test per rule, through the hook as the host calls it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from volta_core.device import V100, Device
from volta_core.errors import KVCacheDtypeRejected
from volta_core.host.checkpoint import checkpoint_kv, quant_config
from volta_core.host.manager import VoltaPluginManager
from volta_core.host.resolution.kv_cache import require_accepted
from volta_core.host.types import CheckpointKV, KVRequest, KVScaleScheme, VerdictStatus
from volta_fp8kv import __version__, plugin
from volta_fp8kv.policy import SCALES_CHECKPOINT, SCALES_UNIT

SM75, SM80, SM89, SM90 = Device((7, 5)), Device((8, 0)), Device((8, 9)), Device((9, 0))
NO_SCALES = CheckpointKV(weight_format="fp16", source="unquantized checkpoint")
W4A16 = CheckpointKV(weight_format="int4", source="compressed-tensors: no KV-cache scales")
DENSE_FP8 = CheckpointKV(weight_format="fp8", source="fp8: no KV-cache scales")
PER_TENSOR_E4M3 = CheckpointKV(
    KVScaleScheme.PER_TENSOR, "fp8_e4m3", "fp8", "compressed-tensors kv_cache_scheme (tensor)"
)
PER_HEAD_E4M3 = CheckpointKV(
    KVScaleScheme.PER_ATTENTION_HEAD, "fp8_e4m3", "fp8", "kv_cache_scheme (attn_head)"
)


@pytest.fixture
def host() -> VoltaPluginManager:
    """The real host manager with this plugin registered the way discovery registers it."""
    manager = VoltaPluginManager(strict=True)
    manager.register(plugin, "fp8kv", distribution="vllm-volta-fp8kv", version=__version__)
    return manager


def verdict(host: VoltaPluginManager, dtype: str, ckpt: CheckpointKV, device: Device):
    decision = host.decide_kv_cache(KVRequest(dtype, ckpt, device))
    ((name, answer),) = decision.verdicts
    assert name == "fp8kv"
    return decision, answer


@pytest.mark.parametrize("dtype", ["fp8", "fp8_e4m3"])
@pytest.mark.parametrize("device", [V100, SM75, SM80])
def test_e4m3_below_sm89_is_rejected_naming_the_hardware_and_e5m2(host, dtype, device):
    decision, answer = verdict(host, dtype, NO_SCALES, device)
    assert decision.accepted is False
    assert answer.status is VerdictStatus.REJECT
    assert "8.9" in answer.reason
    assert device.sm in answer.reason
    assert "fp8e4nv" in answer.reason
    assert "--kv-cache-dtype fp8_e5m2" in answer.reason
    with pytest.raises(KVCacheDtypeRejected, match="fp8_e5m2"):
        require_accepted(decision)


def test_e4m3_rejection_on_sm70_says_what_happens_to_shipped_scales(host):
    _, answer = verdict(host, "fp8", PER_HEAD_E4M3, V100)
    assert answer.status is VerdictStatus.REJECT
    assert "per-attention-head" in answer.reason
    assert "e5m2" in answer.reason


@pytest.mark.parametrize("device", [V100, SM75, SM80, SM89, SM90])
def test_e5m2_is_accepted_everywhere_with_unit_scales_without_checkpoint_scales(host, device):
    decision, answer = verdict(host, "fp8_e5m2", NO_SCALES, device)
    assert decision.accepted is True
    assert answer.scales == SCALES_UNIT
    assert answer.warnings == ()
    assert device.sm in answer.reason


@pytest.mark.parametrize("dtype", ["fp8", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("device", [SM89, SM90])
def test_sm89_and_newer_accept_both_formats(host, dtype, device):
    decision, _ = verdict(host, dtype, PER_TENSOR_E4M3, device)
    assert decision.accepted is True


def test_e4m3_without_scales_on_sm89_warns_about_saturation(host):
    _, answer = verdict(host, "fp8", NO_SCALES, SM90)
    assert answer.status is VerdictStatus.ACCEPT
    assert answer.scales == SCALES_UNIT
    assert any("448" in w for w in answer.warnings)


def test_weight_only_checkpoint_gets_e5m2_with_unit_scales(host):
    decision, answer = verdict(host, "fp8_e5m2", W4A16, V100)
    assert decision.accepted is True
    assert answer.scales == SCALES_UNIT
    assert "weight-only (int4)" in answer.reason
    assert "no checkpoint scales loaded" in answer.reason
    assert answer.warnings == ()


def test_dense_fp8_checkpoint_without_kv_scales_gets_e5m2_with_unit_scales(host):
    decision, answer = verdict(host, "fp8_e5m2", DENSE_FP8, V100)
    assert decision.accepted is True
    assert answer.scales == SCALES_UNIT
    assert "dense FP8-weight checkpoint without KV scales" in answer.reason
    assert "vLLM's own gate" in answer.reason


@pytest.mark.parametrize("ckpt", [PER_TENSOR_E4M3, PER_HEAD_E4M3], ids=["tensor", "attn_head"])
def test_e4m3_calibrated_scales_are_applied_to_e5m2_with_an_exact_warning(host, ckpt):
    decision, answer = verdict(host, "fp8_e5m2", ckpt, V100)
    assert decision.accepted is True
    assert answer.scales == SCALES_CHECKPOINT[ckpt.scheme]
    applied = answer.warnings[0]
    for fact in (
        "applied unchanged",
        "e5m2(x · (1/scale))",
        "multiplies back by the scale",
        "448",
        "57344",
        "2 mantissa bits instead of 3",
        "2^-3",
        "2^-4",
    ):
        assert fact in applied, fact
    assert any("q_scale" in w for w in answer.warnings)
    # The host prefixes every warning with the plugin that gave it.
    assert decision.warnings[0].startswith("fp8kv: ")


def test_e4m3_calibrated_scales_on_sm90_e5m2_point_at_fp8(host):
    _, answer = verdict(host, "fp8_e5m2", PER_HEAD_E4M3, SM90)
    assert any("--kv-cache-dtype fp8 would use these scales" in w for w in answer.warnings)


@pytest.mark.parametrize("ckpt", [PER_TENSOR_E4M3, PER_HEAD_E4M3], ids=["tensor", "attn_head"])
def test_e4m3_calibrated_scales_are_used_as_calibrated_on_sm89(host, ckpt):
    _, answer = verdict(host, "fp8_e4m3", ckpt, SM89)
    assert answer.status is VerdictStatus.ACCEPT
    assert answer.warnings == ()
    assert answer.scales == SCALES_CHECKPOINT[ckpt.scheme]


def test_e5m2_calibrated_scales_on_an_e4m3_cache_are_refused(host):
    ckpt = CheckpointKV(KVScaleScheme.PER_TENSOR, "fp8_e5m2", "fp8", "test")
    _, answer = verdict(host, "fp8", ckpt, SM90)
    assert answer.status is VerdictStatus.REJECT
    assert "saturate" in answer.reason
    _, answer = verdict(host, "fp8_e5m2", ckpt, V100)
    assert answer.status is VerdictStatus.ACCEPT
    assert answer.warnings == ()


def test_scales_of_unstated_calibration_are_applied_with_a_warning(host):
    ckpt = CheckpointKV(KVScaleScheme.PER_TENSOR, None, "fp8", "test")
    _, answer = verdict(host, "fp8_e5m2", ckpt, V100)
    assert "unstated FP8 format" in answer.warnings[0]
    _, answer = verdict(host, "fp8", ckpt, SM90)
    assert "does not state" in answer.warnings[0]


@pytest.mark.parametrize("dtype", ["auto", "float16", "bfloat16"])
def test_no_opinion_on_unquantized_caches(host, dtype):
    decision = host.decide_kv_cache(KVRequest(dtype, NO_SCALES, V100))
    assert decision.accepted is None
    assert decision.verdicts == ()


def test_rules_read_real_checkpoint_configs(host):
    """From the quantization_config sections the core's checkpoint reader understands."""
    weight_only = quant_config(
        {
            "quant_method": "compressed-tensors",
            "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int"}}},
        }
    )
    per_head = quant_config(
        {
            "quant_method": "compressed-tensors",
            "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float"}}},
            "kv_cache_scheme": {
                "num_bits": 8,
                "type": "float",
                "strategy": "attn_head",
                "symmetric": True,
                "dynamic": False,
            },
        }
    )
    _, answer = verdict(host, "fp8_e5m2", checkpoint_kv(weight_only), V100)
    assert answer.scales == SCALES_UNIT
    _, answer = verdict(host, "fp8_e5m2", checkpoint_kv(per_head), V100)
    assert answer.scales == "checkpoint:per_attention_head"
    assert answer.warnings
    _, answer = verdict(
        host, "fp8_e5m2", checkpoint_kv(quant_config({"quant_method": "awq", "bits": 4})), V100
    )
    assert "weight-only (int4)" in answer.reason


def test_discovered_through_the_installed_entry_point():
    manager = VoltaPluginManager(strict=True)
    records = manager.load_entrypoints(["fp8kv"])
    (record,) = [r for r in records if r.name == "fp8kv"]
    assert record.distribution == "vllm-volta-fp8kv"
    assert record.version == __version__
    assert set(record.hooks) == {
        "volta_kv_cache_verdict",
        "volta_kv_cache_ops",
        "volta_kernel_configs",
    }


def test_loading_the_plugin_imports_no_torch_triton_or_vllm():
    code = (
        "import sys, volta_fp8kv.plugin as p\n"
        "from volta_core.device import V100\n"
        "p.volta_kernel_configs(V100)\n"
        "p.volta_kv_cache_ops()\n"
        "print(sorted(m for m in ('torch', 'triton', 'vllm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
