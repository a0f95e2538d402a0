"""Plugin attention backends bound to vLLM's ``AttentionBackendEnum.CUSTOM``, and the class
path vLLM imports for a chosen backend.

``register_backend`` binds a path to an existing enum member: no members are added at run time
(they do not survive pickling), so one process has one ``CUSTOM`` slot. vLLM is imported lazily,
inside the functions.
"""

from __future__ import annotations

from volta_core.errors import PluginError
from volta_core.host.types import AttentionBackendSpec
from volta_core.vllm import report
from volta_core.vllm.reasoning import load_object

#: The ``AttentionBackendEnum`` member plugin backends bind to (built-in members stay vLLM's).
CUSTOM = "CUSTOM"

_bound_custom: str | None = None


def _dotted(impl: str) -> str:
    return impl.replace(":", ".")


def bind_custom_backend(spec: AttentionBackendSpec) -> str:
    """Bind a plugin backend to its existing ``AttentionBackendEnum`` member; return its path.

    Idempotent. One process has one ``CUSTOM`` slot: a second, different backend for it is an
    error naming both.
    """
    global _bound_custom
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    path = _dotted(spec.impl)
    if spec.vllm_name != CUSTOM:
        raise PluginError(
            f"attention backend {spec.name!r} asks for AttentionBackendEnum.{spec.vllm_name}; "
            f"plugin backends bind to {CUSTOM} (built-in members stay vLLM's)"
        )
    if _bound_custom is not None and _bound_custom != path:
        raise PluginError(
            f"attention backends {_bound_custom} and {path} both need AttentionBackendEnum.{CUSTOM}"
        )
    if _bound_custom is None:
        register_backend(AttentionBackendEnum.CUSTOM, path)
        _bound_custom = path
        report.event("attention_bound", backend=spec.name, path=path)
    return path


def backend_class_path(spec: AttentionBackendSpec) -> str:
    """The class path vLLM imports for a chosen backend (plugin backends are bound first)."""
    if spec.builtin:
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        builtin: str = AttentionBackendEnum[spec.vllm_name].get_path()
        return builtin
    path = bind_custom_backend(spec)
    backend = load_object(spec.impl)
    if backend.get_name() != spec.vllm_name:
        raise PluginError(
            f"attention backend {spec.name!r} ({path}) names itself {backend.get_name()!r}; "
            f"its declaration binds it to {spec.vllm_name!r}"
        )
    return path
