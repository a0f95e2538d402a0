"""vllm-volta-attn-v100: the Volta (SM70) attention backend for vLLM, as a vllm-volta plugin."""

__version__ = "0.7.0"
