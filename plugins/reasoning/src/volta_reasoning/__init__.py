"""vllm-volta reasoning plugin: a Qwen3-family reasoning parser that never loses generated text.

The parser (:mod:`volta_reasoning.parser`) is engine-independent; the host's vLLM adapter
registers it with vLLM under the name the plugin declares (``qwen3-volta``).
"""

from volta_reasoning.parser import Qwen3ReasoningParser, ReasoningStream

__version__ = "0.2.0"

__all__ = ["Qwen3ReasoningParser", "ReasoningStream"]
