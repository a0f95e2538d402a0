"""Test and benchmark data: compressed-tensors checkpoints of random fp16 weights.

:func:`library_checkpoint` has the ``compressed-tensors`` library itself quantize and compress a
linear layer (its min-max scales and zero points, its ``pack-quantized`` compressor), which is
what real checkpoints are made with; :func:`library_model` does it for a whole model's linear
layers under their names, with an ignore list. :func:`fresh_checkpoint` makes the same tensors
with this package's packer for machines without the library (the GPU machine); the CPU tests
prove the two identical bit for bit. Not part of the package: the tests and the benchmarks
(``plugins/ct_wna16/benchmarks``) import it from this folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from volta_ct_wna16.layout import PackedWeights, pack_int32, prepare
from volta_ct_wna16.scheme import WeightScheme

#: Library-made checkpoints carried to machines without compressed-tensors (the GPU machine):
#: ``python plugins/ct_wna16/tests/ct_wna16_checkpoints.py [PATH]`` writes them.
LIBRARY_FIXTURES = Path(
    os.environ.get(
        "CT_WNA16_FIXTURES",
        Path(__file__).resolve().parents[1] / ".fixtures" / "library_checkpoints.safetensors",
    )
)

#: The shape of each layer in :data:`LIBRARY_FIXTURES` (N, K; neither a power of two).
FIXTURE_SHAPE = (600, 1152)


@dataclass
class Checkpoint:
    """One layer's checkpoint tensors (compressed-tensors names) and its quantization config."""

    tensors: dict[str, torch.Tensor]
    config: dict[str, Any]
    scheme: WeightScheme

    @property
    def shape(self) -> tuple[int, int]:
        n, k = (int(v) for v in self.tensors["weight_shape"])
        return n, k

    def packed(self, name: str = "test", device: torch.device | str | None = None) -> PackedWeights:
        """The layer in the kernels' layout (:func:`~volta_ct_wna16.layout.prepare`, fp16
        activations), its tensors moved to ``device`` first when given."""
        n, k = self.shape
        t = {key: v.to(device) for key, v in self.tensors.items()} if device else self.tensors
        return prepare(
            name,
            self.scheme,
            n=n,
            k=k,
            weight_packed=t["weight_packed"],
            weight_scale=t["weight_scale"],
            weight_zero_point=t.get("weight_zero_point"),
            act_dtype=torch.float16,
        )


def quantization_config(scheme: WeightScheme, ignore: list[str] | None = None) -> dict[str, Any]:
    """A ``quantization_config`` section as compressed-tensors 0.17 writes it (JSON types)."""
    weights: dict[str, Any] = {
        "num_bits": scheme.num_bits,
        "type": "int",
        "symmetric": scheme.symmetric,
        "group_size": scheme.group_size,
        "strategy": "group" if scheme.group_size else "channel",
        "dynamic": False,
        "actorder": None,
    }
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": weights,
                "input_activations": None,
                "output_activations": None,
                "format": "pack-quantized",
            }
        },
        "ignore": list(ignore or ["lm_head"]),
        "kv_cache_scheme": None,
    }


def random_weight(n: int, k: int, generator: torch.Generator, shifted: bool) -> torch.Tensor:
    """fp16 weights; ``shifted`` adds a per-row offset so asymmetric zero points vary."""
    device = generator.device
    w = torch.randn(n, k, generator=generator, device=device) * 0.05
    if shifted:
        w += (torch.rand(n, 1, generator=generator, device=device) - 0.5) * 0.1
    return w.to(torch.float16)


def library_checkpoint(
    n: int, k: int, scheme: WeightScheme, seed: int = 0, weight: torch.Tensor | None = None
) -> Checkpoint:
    """Quantize and compress a random ``[n, k]`` fp16 linear layer with compressed-tensors."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationScheme,
        apply_quantization_config,
    )

    gen = torch.Generator().manual_seed(seed)
    if weight is None:
        weight = random_weight(n, k, gen, shifted=not scheme.symmetric)
    model = torch.nn.Sequential(torch.nn.Linear(k, n, bias=False, dtype=torch.float16))
    linear = model[0]
    linear.weight.data.copy_(weight)
    args = library_args(scheme)
    config = QuantizationConfig(
        config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=args)},
        format="pack-quantized",
    )
    apply_quantization_config(model, config)
    set_minmax_qparams(linear, scheme, args)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="pack-quantized")
    compressor.compress_model(model)
    tensors = {name: t.detach().clone() for name, t in linear.state_dict().items()}
    return Checkpoint(tensors, quantization_config(scheme), scheme)


def library_args(scheme: WeightScheme) -> Any:
    """The library's ``QuantizationArgs`` for the weights of ``scheme``."""
    from compressed_tensors.quantization import QuantizationArgs

    return QuantizationArgs(
        num_bits=scheme.num_bits,
        type="int",
        symmetric=scheme.symmetric,
        strategy="group" if scheme.group_size else "channel",
        group_size=scheme.group_size,
    )


def set_minmax_qparams(linear: torch.nn.Linear, scheme: WeightScheme, args: Any) -> None:
    """Give a linear layer the library has prepared (``apply_quantization_config``) the
    min-max scales and zero points of its weight, computed by the library's
    ``calculate_qparams`` (what its min-max observer hands it)."""
    from compressed_tensors.quantization.utils import calculate_qparams

    k = linear.weight.shape[1]
    group = scheme.group_for(k)
    grouped = linear.weight.detach().float().unflatten(-1, (k // group, group))
    scale, zero = calculate_qparams(grouped.amin(-1), grouped.amax(-1), args)
    linear.weight_scale.data.copy_(scale.reshape(linear.weight_scale.shape))
    if not scheme.symmetric:
        linear.weight_zero_point.data.copy_(zero.reshape(linear.weight_zero_point.shape))


@dataclass
class LibraryModel:
    """A model's linear layers as the compressed-tensors library quantizes and saves them.

    ``tensors``: the checkpoint tensors of every linear layer (``<name>.weight_packed`` etc.
    for the quantized ones, ``<name>.weight`` for those the ignore list keeps); ``dequantized``:
    ``<name>.weight`` of each quantized layer as the library's fake quantization gives it back
    (the function the packed weights stand for), in the weight's dtype; ``compressor``: the
    library's ``ModelCompressor``, whose ``update_config`` writes the checkpoint's
    ``quantization_config`` (the ignore list resolved to layer names, as saved models have it).
    """

    tensors: dict[str, torch.Tensor]
    dequantized: dict[str, torch.Tensor]
    compressor: Any


def library_model(
    linears: dict[str, torch.Tensor], scheme: WeightScheme, ignore: list[str]
) -> LibraryModel:
    """Quantize the linear layers ``linears`` (module name: ``[out, in]`` weight) with
    compressed-tensors: a ``Linear`` target with ``scheme`` and the given ``ignore`` list
    (names and ``re:`` patterns, matched by the library), min-max qparams, ``pack-quantized``.

    The layers are placed in one module tree under their names, so the library matches and
    names them as it does in a saved model; their weights are used in place (not copied).
    """
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationScheme,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize

    root = torch.nn.Module()
    for name, weight in linears.items():
        *path, leaf = name.split(".")
        parent = root
        for part in path:
            if part not in parent._modules:
                parent.add_module(part, torch.nn.Module())
            parent = parent._modules[part]
        linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
        linear.weight = torch.nn.Parameter(weight, requires_grad=False)
        parent.add_module(leaf, linear)
    args = library_args(scheme)
    config = QuantizationConfig(
        config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=args)},
        ignore=ignore,
        format="pack-quantized",
    )
    apply_quantization_config(root, config)
    dequantized: dict[str, torch.Tensor] = {}
    for name, module in root.named_modules():
        if getattr(module, "quantization_scheme", None) is None:
            continue
        set_minmax_qparams(module, scheme, args)
        zero = getattr(module, "weight_zero_point", None)
        dequantized[f"{name}.weight"] = fake_quantize(
            module.weight, module.weight_scale, zero, args
        )
    compressor = ModelCompressor.from_pretrained_model(root, quantization_format="pack-quantized")
    compressor.compress_model(root)
    tensors = {name: t.detach().contiguous() for name, t in root.state_dict().items()}
    return LibraryModel(tensors, dequantized, compressor)


def fresh_checkpoint(
    n: int, k: int, scheme: WeightScheme, seed: int = 0, device: str | torch.device = "cpu"
) -> Checkpoint:
    """The same checkpoint as :func:`library_checkpoint`, made without the library.

    Min-max scales and zero points as compressed-tensors computes them (0 always representable,
    zero point rounded and clamped), values rounded half to even and clamped, then packed.
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    weight = random_weight(n, k, gen, shifted=not scheme.symmetric)
    return quantize_with_packer(weight, scheme)


def quantize_with_packer(weight: torch.Tensor, scheme: WeightScheme) -> Checkpoint:
    """Min-max quantize ``weight`` as compressed-tensors does and pack it with this package."""
    n, k = weight.shape
    bits = scheme.num_bits
    qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    group = scheme.group_for(k)
    grouped = weight.float().unflatten(-1, (k // group, group))
    lo = grouped.amin(-1).clamp(max=0)
    hi = grouped.amax(-1).clamp(min=0)
    if scheme.symmetric:
        scale = torch.maximum(lo.abs(), hi) / ((qmax - qmin) / 2)
        zero = torch.zeros_like(scale)
    else:
        scale = (hi - lo) / (qmax - qmin)
        zero = (qmin - lo / scale).clamp(qmin, qmax)
    zero = torch.round(zero).to(torch.int8)
    scale = scale.to(weight.dtype)
    scale = torch.where(scale == 0, torch.finfo(weight.dtype).eps, scale)
    # As the library does: divide in the weight's dtype, add the zero point, clamp, round.
    scaled = grouped.to(weight.dtype) / scale.unsqueeze(-1) + zero.to(weight.dtype).unsqueeze(-1)
    q = torch.round(scaled.clamp(qmin, qmax)).reshape(n, k).to(torch.int8)
    tensors = {
        "weight_packed": pack_int32(q, bits, dim=1),
        "weight_scale": scale,
        "weight_shape": torch.tensor([n, k]),
    }
    if not scheme.symmetric:
        tensors["weight_zero_point"] = pack_int32(zero, bits, dim=0)
    return Checkpoint(tensors, quantization_config(scheme), scheme)


def write_library_fixtures(path: Path = LIBRARY_FIXTURES) -> Path:
    """One library-made checkpoint per supported scheme, keyed ``<label>/<tensor>``."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    for bits in (4, 8):
        for symmetric in (True, False):
            for group in (32, 64, 128, None):
                scheme = WeightScheme(bits, symmetric, group)
                ckpt = library_checkpoint(*FIXTURE_SHAPE, scheme, seed=bits + group_seed(group))
                tag = scheme.label.replace(" ", "-")
                tensors.update({f"{tag}/{k}": v.contiguous() for k, v in ckpt.tensors.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path))
    return path


def group_seed(group: int | None) -> int:
    return 1000 if group is None else group


if __name__ == "__main__":
    import sys

    print(write_library_fixtures(Path(sys.argv[1]) if len(sys.argv) > 1 else LIBRARY_FIXTURES))
