"""Errors raised by the host. Each names what is wrong in one sentence a user can act on.


Imports nothing else of the host, so every module can raise them.
"""

from __future__ import annotations

from typing import Any


class VoltaError(Exception):
    """Base class of every error the host raises on purpose."""


class UsageError(VoltaError):
    """Bad input from a user: an unknown device, dtype, example or a malformed config."""


class PluginError(VoltaError):
    """A plugin could not be loaded or registered, or it broke a host rule.

    ``hook`` names the hook the plugin failed in, when it failed in one.
    """

    def __init__(self, message: str, *, hook: str = "") -> None:
        super().__init__(message)
        self.hook = hook


class IncompatiblePluginError(PluginError):
    """A plugin was written for a host API version this host does not speak."""


class DuplicateDeclarationError(PluginError):
    """Two plugins declared the same backend, quant method or parser name."""


class NoAttentionBackendError(VoltaError):
    """No candidate backend admits an attention layer; the message lists every refusal.

    ``summary`` is the message without the layer's name, so a plan can group identical layers;
    ``refusals`` holds each backend's :class:`~volta_core.host.types.BackendRefusal`.
    """

    def __init__(self, layer_prefix: str, summary: str, refusals: tuple[Any, ...]) -> None:
        self.layer_prefix, self.summary, self.refusals = layer_prefix, summary, refusals
        super().__init__(f"layer {layer_prefix}: {summary}")


class KVCacheDtypeRejected(VoltaError):
    """The requested KV-cache dtype was rejected; the message lists every plugin's reason."""


class ReasoningTextLost(VoltaError):
    """A reasoning post-processor returned a split that drops generated text."""
