"""Test data: one linear layer's FP8 checkpoint tensors, as the two writers of dense FP8
checkpoints store them, with the function they stand for in float64.

* :func:`fp8_checkpoint`: vLLM's ``fp8`` method. ``block`` as Qwen's official FP8 releases
  have it: ``weight`` float8_e4m3fn and ``weight_scale_inv`` float32
  ``[ceil(n / 128), ceil(k / 128)]``, each block quantized by its own amax / 448 (a partial
  block at the right or bottom edge by the amax of the weights it holds); quantized here in
  torch, since the releases' own tool is not public. ``block=None``: AutoFP8's per-tensor
  layout (a 0-d ``weight_scale``, and a 0-d ``input_scale`` for its static activations).
* :func:`ct_checkpoint`: compressed-tensors ``float-quantized``, written by the
  compressed-tensors library itself: its ``QuantizationArgs`` (8-bit ``float``, strategy
  ``block`` 128 x 128, ``channel`` or ``tensor``, with the input activations of
  llm-compressor's FP8_BLOCK, FP8_DYNAMIC and FP8 schemes), ``apply_quantization_config``, the
  min-max scales of its ``calculate_qparams``, its compressor, and its ``update_config`` for the
  ``quantization_config`` section.

:attr:`Checkpoint.dense` is ``W`` in float64, ``e4m3(weight) * scale`` expanded over each
scale's block, read back from the stored tensors (independently of the plugin's layout code).
Not part of the package: the tests import it from this folder.
"""

from __future__ import annotations

import copy
import functools
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

#: e4m3fn's largest finite value.
E4M3_MAX = 448.0

#: The scale tensor of each strategy as compressed-tensors names it (vLLM ``fp8`` blocks:
#: ``weight_scale_inv``).
CT_STRATEGIES = ("block", "channel", "tensor")

#: Qwen's and llm-compressor's FP8 block.
BLOCK = (128, 128)


@dataclass(frozen=True)
class Checkpoint:
    """One layer's checkpoint tensors (checkpoint names), the ``quantization_config`` of a
    checkpoint holding it, and ``dense``: ``W`` ``[n, k]`` in float64."""

    tensors: dict[str, torch.Tensor]
    config: dict[str, Any]
    dense: torch.Tensor

    @property
    def scale_name(self) -> str:
        return "weight_scale_inv" if "weight_scale_inv" in self.tensors else "weight_scale"

    def copy(self) -> Checkpoint:
        """A copy whose tensors a test may spoil in place."""
        tensors = {name: t.clone() for name, t in self.tensors.items()}
        return Checkpoint(tensors, copy.deepcopy(self.config), self.dense)


def random_weight(n: int, k: int, seed: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """A trained-looking ``[n, k]`` weight: Gaussian, a few rows and columns louder (so block
    and channel scales differ), in ``dtype`` (bf16, as the models these checkpoints come from)."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * 0.02
    w *= 1 + 3 * torch.rand(n, 1, generator=gen) ** 4
    w *= 1 + 3 * torch.rand(1, k, generator=gen) ** 4
    return w.to(dtype)


def expand(scale: torch.Tensor, n: int, k: int, block: tuple[int, int]) -> torch.Tensor:
    """One scale per weight: ``scale[i // block_n, j // block_k]`` for ``[n, k]``, float64."""
    block_n, block_k = block
    s = scale.double().reshape(-(-n // block_n), -(-k // block_k))
    return s.repeat_interleave(block_n, 0)[:n].repeat_interleave(block_k, 1)[:, :k]


def dense(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """``e4m3(weight) * scale`` in float64, ``block`` the rows and columns one scale covers."""
    n, k = weight.shape
    return weight.double() * expand(scale, n, k, block)


def block_amax(w: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """The largest magnitude in each ``block`` of ``w`` (edge blocks: the weights they hold)."""
    n, k = w.shape
    block_n, block_k = block
    rows, cols = -(-n // block_n), -(-k // block_k)
    padded = torch.zeros(rows * block_n, cols * block_k, dtype=torch.float32)
    padded[:n, :k] = w.float().abs()
    return padded.reshape(rows, block_n, cols, block_k).amax(dim=(1, 3))


# -- vLLM ``fp8`` ------------------------------------------------------------------------------


def fp8_config(
    block: tuple[int, int] | None = BLOCK, ignored: list[str] | None = None
) -> dict[str, Any]:
    """The ``quantization_config`` of a vLLM ``fp8`` checkpoint: Qwen's FP8 releases'
    (``weight_block_size``, dynamic activations, ``modules_to_not_convert``), or AutoFP8's
    per-tensor one (static activations, ``ignored_layers``) when ``block`` is None."""
    if block is None:
        return {
            "quant_method": "fp8",
            "activation_scheme": "static",
            "ignored_layers": list(ignored or ["lm_head"]),
        }
    return {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": list(block),
        "modules_to_not_convert": list(ignored or ["lm_head"]),
    }


def quantize_e4m3(w: torch.Tensor, scale_per_weight: torch.Tensor) -> torch.Tensor:
    """``w / scale`` rounded to e4m3fn (round to nearest even), clamped to its range."""
    return (w.float() / scale_per_weight.float()).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


@functools.cache
def fp8_checkpoint(
    n: int, k: int, block: tuple[int, int] | None = BLOCK, seed: int = 0
) -> Checkpoint:
    """A random ``[n, k]`` layer in vLLM's ``fp8`` layout (see the module); cached: callers that
    change the tensors take :meth:`Checkpoint.copy` first."""
    w = random_weight(n, k, seed)
    if block is None:
        scale = (w.float().abs().amax() / E4M3_MAX).reshape(())
        q = quantize_e4m3(w, scale)
        tensors = {
            "weight": q,
            "weight_scale": scale,
            "input_scale": torch.tensor(0.0123, dtype=torch.float32),
        }
        return Checkpoint(tensors, fp8_config(None), dense(q, scale, (n, k)))
    scale = block_amax(w, block) / E4M3_MAX
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = quantize_e4m3(w, expand(scale, n, k, block))
    tensors = {"weight": q, "weight_scale_inv": scale}
    return Checkpoint(tensors, fp8_config(block), dense(q, scale, block))


# -- compressed-tensors ``float-quantized``, by the library ---------------------------------------


def ct_args(strategy: str) -> tuple[Any, Any]:
    """The library's weight and input-activation ``QuantizationArgs`` of llm-compressor's FP8
    scheme with ``strategy`` weights: FP8_BLOCK (``block`` 128 x 128, dynamic per-128 groups),
    FP8_DYNAMIC (``channel``, dynamic per token) or FP8 (``tensor``, static per tensor)."""
    from compressed_tensors.quantization import QuantizationArgs

    weights = QuantizationArgs(
        num_bits=8,
        type="float",
        strategy=strategy,
        symmetric=True,
        dynamic=False,
        block_structure=list(BLOCK) if strategy == "block" else None,
    )
    inputs = {
        "block": {"strategy": "group", "group_size": BLOCK[1], "dynamic": True},
        "channel": {"strategy": "token", "dynamic": True},
        "tensor": {"strategy": "tensor", "dynamic": False},
    }[strategy]
    activations = QuantizationArgs(num_bits=8, type="float", symmetric=True, **inputs)
    return weights, activations


def ct_min_max(w: torch.Tensor, strategy: str) -> tuple[torch.Tensor, torch.Tensor]:
    """What the library's min-max observer hands ``calculate_qparams`` for ``strategy``."""
    w = w.float()
    if strategy == "tensor":
        return w.amin().reshape(1), w.amax().reshape(1)
    if strategy == "channel":
        return w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
    amax = block_amax(w, BLOCK)
    return -amax, amax


def ct_scale_block(strategy: str, n: int, k: int) -> tuple[int, int]:
    """The rows and columns one stored scale covers."""
    return {"block": BLOCK, "channel": (1, k), "tensor": (n, k)}[strategy]


@functools.cache
def ct_checkpoint(
    n: int, k: int, strategy: str, seed: int = 0, dtype: torch.dtype = torch.bfloat16
) -> Checkpoint:
    """A random ``[n, k]`` layer quantized and compressed by compressed-tensors (see the
    module); ``config`` is the section its ``update_config`` writes. Cached: callers that change
    the tensors take :meth:`Checkpoint.copy` first."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationScheme,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.utils import calculate_qparams

    model = torch.nn.Module()
    model.add_module("proj", torch.nn.Linear(k, n, bias=False, dtype=dtype))
    linear = model.proj
    linear.weight.data.copy_(random_weight(n, k, seed, dtype))
    weights, activations = ct_args(strategy)
    config = QuantizationConfig(
        config_groups={
            "group_0": QuantizationScheme(
                targets=["Linear"], weights=weights, input_activations=activations
            )
        },
        ignore=["lm_head"],
    )
    apply_quantization_config(model, config)
    with torch.no_grad():
        lo, hi = ct_min_max(linear.weight, strategy)
        scale, _ = calculate_qparams(lo, hi, weights)
        linear.weight_scale.copy_(scale.reshape(linear.weight_scale.shape))
        if hasattr(linear, "input_scale"):  # static activations: a calibrated amax / 448
            linear.input_scale.fill_(0.0123)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    tensors = {name: t.detach().clone() for name, t in linear.state_dict().items()}
    with tempfile.TemporaryDirectory() as folder:
        compressor.update_config(folder)
        written = json.loads((Path(folder) / "config.json").read_text())
    section = written["quantization_config"]
    block = ct_scale_block(strategy, n, k)
    return Checkpoint(tensors, section, dense(tensors["weight"], tensors["weight_scale"], block))


def ct_config(strategy: str, ignore: list[str] | None = None) -> dict[str, Any]:
    """The ``quantization_config`` the library writes for ``strategy`` (from a small layer),
    with ``ignore`` as the checkpoint's resolved ignore list."""
    section = copy.deepcopy(ct_checkpoint(128, 128, strategy).config)
    if ignore is not None:
        section["ignore"] = list(ignore)
    return section


# -- one layer's shards ------------------------------------------------------------------------

#: The schemes the tests run, by label: vLLM ``fp8`` 128 x 128 blocks (Qwen's releases), vLLM
#: ``fp8`` per tensor (AutoFP8), compressed-tensors channel, block and tensor.
SCHEMES = ("fp8-block", "fp8-tensor", "ct-channel", "ct-block", "ct-tensor")


def checkpoint(scheme: str, n: int, k: int, seed: int = 0) -> Checkpoint:
    """One ``[n, k]`` checkpoint tensor set of ``scheme`` (a label of :data:`SCHEMES`)."""
    source, strategy = scheme.split("-")
    if source == "fp8":
        return fp8_checkpoint(n, k, BLOCK if strategy == "block" else None, seed)
    return ct_checkpoint(n, k, strategy, seed)


def config(scheme: str, ignore: list[str] | None = None) -> dict[str, Any]:
    """The ``quantization_config`` of a checkpoint of ``scheme``, ``ignore`` its ignore list
    (``ignored_layers`` / ``modules_to_not_convert`` for ``fp8``)."""
    source, strategy = scheme.split("-")
    if source == "fp8":
        return fp8_config(BLOCK if strategy == "block" else None, ignore)
    return ct_config(strategy, ignore)
