"""Errors raised by the host. Each names what is wrong in one sentence a user can act on."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from volta_core.device import Device
    from volta_core.types import AttentionLayer, BackendRefusal


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

    ``summary`` is the message without the layer's name, so a plan can group identical layers.
    """

    def __init__(self, layer: AttentionLayer, device: Device, refusals: tuple[BackendRefusal, ...]):
        from volta_core.types import canonical_kv_dtype

        self.layer, self.device, self.refusals = layer, device, refusals
        detail = "; ".join(f"{r.backend}: {r.reason}" for r in refusals) or "no backend is declared"
        kv = canonical_kv_dtype(layer.kv_cache_dtype, layer.dtype)
        self.summary = (
            f"no attention backend can run head size {layer.head_size}, {layer.dtype}, KV {kv} "
            f"on {device.sm}: {detail}"
        )
        super().__init__(f"layer {layer.prefix}: {self.summary}")


class KVCacheDtypeRejected(VoltaError):
    """The requested KV-cache dtype was rejected; the message lists every plugin's reason."""


class ReasoningTextLost(VoltaError):
    """A reasoning post-processor returned a split that drops generated text."""
