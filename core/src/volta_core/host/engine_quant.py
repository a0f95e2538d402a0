"""Which checkpoint formats each vLLM family runs by itself, from which compute capability.

A linear or expert layer no plugin claims is built by the family's own quantization method,
which refuses a GPU below its minimum (vLLM checks ``get_min_capability()`` at start-up, and
its Marlin kernels refuse below 7.5 when the layer is built). The plan reports such a layer as
a problem with its fix: the plugin that serves the format, or the family that runs it; where an
installed plugin declined the layer, its reason and what runs the layer instead.

Read from the families' sources (``vllm/model_executor/layers/quantization/``):

- vLLM 0.19.1: ``awq``, ``awq_marlin``, ``gptq_marlin``, ``fp8`` 7.5; ``gptq`` 6.0 (its exllama
  kernels); compressed-tensors' weight-only and FP8 schemes 7.5 (``CompressedTensorsWNA16``,
  ``CompressedTensorsW8A16Fp8``).
- vLLM 0.32-0.33: AWQ and GPTQ are ``AutoAWQConfig`` / ``AutoGPTQConfig``; GPTQ's config says
  6.0 but its only CUDA linear method is Marlin (``query_marlin_supported_quant_types`` returns
  nothing below 7.5); the rest as 0.19.
- 1Cat-vLLM 1.2-1.3 and 1.4-1.5: AWQ (TurboMind SM70 GEMMs, ``awq_marlin`` 7.0), GPTQ and FP8 on
  its own SM70 paths; compressed-tensors only when asked
  (``VLLM_SM70_COMPRESSED_TENSORS_TURBOMIND``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

_AWQ = ("awq", "awq_marlin", "auto_awq")
_GPTQ = ("gptq", "gptq_marlin", "auto_gptq")


def _table(**groups: tuple[tuple[str, ...], tuple[int, int]]) -> dict[str, tuple[int, int]]:
    return {method: minimum for names, minimum in groups.values() for method in names}


#: Per vLLM family (``volta_core.vllm.families.Family.name``): the lowest compute capability at
#: which its own method runs a quantized linear or expert layer of each ``quant_method``.
ENGINE_MIN_CAPABILITY: Mapping[str, Mapping[str, tuple[int, int]]] = {
    "vLLM 0.19": _table(
        awq=(_AWQ, (7, 5)),
        gptq=(("gptq",), (6, 0)),
        marlin=(("gptq_marlin", "auto_gptq"), (7, 5)),
        fp8=(("fp8",), (7, 5)),
        ct=(("compressed-tensors",), (7, 5)),
    ),
    **dict.fromkeys(
        ("1Cat-vLLM 1.2-1.3", "1Cat-vLLM 1.4-1.5"),
        _table(
            awq=(_AWQ, (7, 0)),
            gptq=(_GPTQ, (7, 0)),
            fp8=(("fp8",), (7, 0)),
            ct=(("compressed-tensors",), (7, 5)),
        ),
    ),
    "vLLM 0.32-0.33": _table(
        awq=(_AWQ, (7, 5)),
        gptq=(_GPTQ, (7, 5)),
        fp8=(("fp8",), (7, 5)),
        ct=(("compressed-tensors",), (7, 5)),
    ),
}

#: The distribution that serves a format's layers on SM70 (the fix a refusal names).
PLUGIN_FOR_METHOD: Mapping[str, str] = {
    **dict.fromkeys((*_AWQ, *_GPTQ, "compressed-tensors"), "vllm-volta-ct-wna16"),
    "fp8": "vllm-volta-fp8w",
}


def _sm(capability: tuple[int, int]) -> str:
    return f"{capability[0]}.{capability[1]}"


def engine_refusal(
    method: str,
    capability: tuple[int, int],
    family: str | None = None,
    declines: Sequence[str] = (),
) -> tuple[str, str] | None:
    """``(problem, fix)`` when the engine would refuse a layer of ``method`` that no plugin
    claims, on a device of ``capability``; None when it runs it (or the method is unknown here).

    ``family``: the installed vLLM family's name; None (no vLLM installed) asks every family and
    reports a refusal where one of them refuses, naming the ones that run it.

    ``declines``: what the installed plugins said when they declined the layer (``plugin:
    method: reason``). Installing the plugin then fixes nothing: the problem gives the reasons,
    and the fix is what the reasons name or a family whose own kernels run the format here.
    """
    families = [family] if family is not None else list(ENGINE_MIN_CAPABILITY)
    minimums = {
        name: ENGINE_MIN_CAPABILITY[name][method]
        for name in families
        if method in ENGINE_MIN_CAPABILITY.get(name, {})
    }
    refusing = [name for name, minimum in minimums.items() if capability < minimum]
    if not refusing:
        return None
    running = [name for name, minimum in minimums.items() if capability >= minimum]
    needs = " / ".join(sorted({_sm(minimums[name]) for name in refusing}))
    runs = (
        f"{' and '.join(refusing)} run{'s' if len(refusing) == 1 else ''} {method!r} layers "
        f"from compute capability {needs}"
    )
    if declines:
        elsewhere = running or [
            name
            for name, table in ENGINE_MIN_CAPABILITY.items()
            if name not in refusing and method in table and capability >= table[method]
        ]
        problem = (
            f"{runs}, and the installed Volta plugins decline them on {_sm(capability)} "
            f"({'; '.join(declines)})"
        )
        fix = "change what the decline names, so that the plugin serves them"
        if elsewhere:
            fix += f", or serve with {' or '.join(elsewhere)}, whose own kernels run them"
        return problem, fix
    problem = f"{runs}, and no Volta plugin claims them on {_sm(capability)}"
    fixes = []
    if method in PLUGIN_FOR_METHOD:
        fixes.append(f"pip install {PLUGIN_FOR_METHOD[method]}")
    if running:
        fixes.append(f"or serve with {' or '.join(running)}")
    return problem, " ".join(fixes) or "no vLLM family runs it on this GPU"
