"""Errors raised by the host. Each names what is wrong in one sentence a user can act on."""

from __future__ import annotations


class VoltaError(Exception):
    """Base class of every error the host raises on purpose."""


class UsageError(VoltaError):
    """Bad input from a user: an unknown device, dtype, example or a malformed config."""


class PluginError(VoltaError):
    """A plugin could not be loaded or registered, or it broke a host rule."""


class IncompatiblePluginError(PluginError):
    """A plugin was written for a host API version this host does not speak."""


class DuplicateDeclarationError(PluginError):
    """Two plugins declared the same backend, quant method or parser name."""


class NoAttentionBackendError(VoltaError):
    """No candidate backend admits an attention layer; the message lists every refusal."""


class KVCacheDtypeRejected(VoltaError):
    """The requested KV-cache dtype was rejected; the message lists every plugin's reason."""


class ReasoningTextLost(VoltaError):
    """A reasoning post-processor returned a split that drops generated text."""
