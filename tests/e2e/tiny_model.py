"""A scripted tiny Qwen3 checkpoint whose greedy output is known in advance.

The weights make the model a bigram table: every decoder layer is scaled to almost nothing, so the
residual stream at each position is the embedding of the current token (a one-hot vector), and
``lm_head`` maps that one-hot to a large logit on the token :data:`NEXT` names. Greedy decoding
then follows the script exactly, whatever attention backend, KV-cache dtype or 4-bit weight
quantization runs the (near-zero) layers:

- thinking on (the chat template ends the prompt with ``<think>``):
  ``a b c</think>\\n\\nanswer text`` then ``<|im_end|>``;
- thinking off (the prompt ends with ``assistant\\n``): ``answer text`` then ``<|im_end|>``.

The tokenizer is a real ``tokenizers`` word-level tokenizer; ``<think>`` and ``</think>`` are added
*non-special* tokens so they stay in the generated text, ``<|im_end|>`` is the special EOS token.
Checkpoints are written with real safetensors; the quantized variants are written by the
``compressed-tensors`` library (pack-quantized W4A16, optionally with an fp8 ``kv_cache_scheme``).
"""

from __future__ import annotations

import json
from pathlib import Path

HIDDEN = 128
INTERMEDIATE = 256
VOCAB = 64
HEAD_DIM = 64
NUM_HEADS = 2
NUM_KV_HEADS = 1
NUM_LAYERS = 2

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
THINK = ["<think>", "</think>"]
WORDS = [
    "[UNK]",
    "system",
    "user",
    "assistant",
    "\n",
    "\n\n",
    "a",
    " b",
    " c",
    "answer",
    " text",
    " ",
]
TOKENS = SPECIAL + THINK + WORDS
TOKENS += [f"<unused_{i}>" for i in range(VOCAB - len(TOKENS))]
ID = {tok: i for i, tok in enumerate(TOKENS)}

#: The bigram script: the token greedy decoding emits after each token; anything else ends.
NEXT = {
    "<think>": "a",
    "a": " b",
    " b": " c",
    " c": "</think>",
    "</think>": "\n\n",
    "\n\n": "answer",
    "\n": "answer",
    "answer": " text",
    " text": "<|im_end|>",
}

#: What the engine generates (special tokens skipped) for a thinking and a non-thinking prompt.
THINKING_OUTPUT_TOKENS = ["a", " b", " c", "</think>", "\n\n", "answer", " text"]
THINKING_OUTPUT = "".join(THINKING_OUTPUT_TOKENS)
PLAIN_OUTPUT = "answer text"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is not defined or enable_thinking %}<think>{% endif %}"
    "{% endif %}"
)


def build_tokenizer():  # -> tokenizers.Tokenizer
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(TOKENS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"\n\n|\n| ?[^\s]+| "), "isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK])
    return tokenizer


def _write_tokenizer(out: Path) -> None:
    build_tokenizer().save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": "[UNK]",
        "model_max_length": 512,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": "[UNK]"})
    )


def _hf_config():  # -> transformers.Qwen3Config
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=ID["<|im_end|>"],
        pad_token_id=ID["<|endoftext|>"],
        torch_dtype="bfloat16",
    )


def build_model():  # -> transformers.Qwen3ForCausalLM with the bigram weights
    import torch
    from transformers import Qwen3ForCausalLM

    generator = torch.Generator().manual_seed(0)
    model = Qwen3ForCausalLM(_hf_config()).to(torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * 2e-3)
        embed = model.model.embed_tokens.weight
        embed.zero_()
        embed[:, :VOCAB] = torch.eye(VOCAB)
        lm_head = model.lm_head.weight
        lm_head.zero_()
        for tok in TOKENS:
            lm_head[ID[NEXT.get(tok, "<|im_end|>")], ID[tok]] = 20.0
    return model.to(torch.bfloat16)


def write_dense(out: Path) -> Path:
    """The unquantized bf16 checkpoint."""
    out.mkdir(parents=True, exist_ok=True)
    build_model().save_pretrained(out, safe_serialization=True)
    _write_tokenizer(out)
    return out


def write_w4a16(out: Path, *, fp8_kv_scheme: str | None = None) -> Path:
    """A pack-quantized W4A16 checkpoint written by compressed-tensors.

    ``fp8_kv_scheme`` (``"tensor"`` or ``"attn_head"``) adds an fp8 ``kv_cache_scheme`` with unit
    KV scales, as llm-compressor writes for e4m3-calibrated KV caches; None is weight-only.
    """
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        QuantizationStatus,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.utils import calculate_qparams

    out.mkdir(parents=True, exist_ok=True)
    model = build_model()
    weights = QuantizationArgs(
        num_bits=4, type="int", symmetric=True, strategy="group", group_size=128
    )
    kv = None
    if fp8_kv_scheme is not None:
        kv = QuantizationArgs(
            num_bits=8, type="float", symmetric=True, strategy=fp8_kv_scheme, dynamic=False
        )
    config = QuantizationConfig(
        config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=weights)},
        ignore=["lm_head"],
        kv_cache_scheme=kv,
        quantization_status=QuantizationStatus.INITIALIZED,
    )
    apply_quantization_config(model, config)
    with torch.no_grad():
        for module in model.modules():
            scheme = getattr(module, "quantization_scheme", None)
            if scheme is None:
                continue
            if scheme.weights is not None:
                w = module.weight.float().reshape(module.weight.shape[0], -1, 128)
                scale, zero_point = calculate_qparams(w.amin(-1), w.amax(-1), scheme.weights)
                module.weight_scale.data = scale.to(module.weight_scale.dtype)
                module.weight_zero_point.data = zero_point.to(module.weight_zero_point.dtype)
            for kv_name in ("k_scale", "v_scale"):
                if hasattr(module, kv_name):
                    getattr(module, kv_name).data.fill_(1.0)
            module.quantization_status = QuantizationStatus.FROZEN
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(out, safe_serialization=True)
    compressor.update_config(str(out))
    _write_tokenizer(out)
    return out


if __name__ == "__main__":
    import sys

    root = Path(sys.argv[1])
    write_dense(root / "dense")
    write_w4a16(root / "w4a16")
    write_w4a16(root / "w4a16-kv", fp8_kv_scheme="tensor")


def prompt_ids(tokenizer, thinking: bool) -> list[int]:  # tokenizer: vLLM's, of a checkpoint here
    """The chat template's prompt for one user turn, thinking or not, as token ids."""
    messages = [{"role": "user", "content": "hello there"}]
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=thinking
    )
    return tokenizer.encode(text, add_special_tokens=False)
