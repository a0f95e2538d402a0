"""The ASTSource shim: the constexpr argument is found by name on any Triton 3.x constructor."""

from __future__ import annotations

from typing import Any

import pytest

from volta_devkit.gate import make_ast_source


class NewStyle:
    """Triton 3.5+: ``ASTSource(fn, signature, constexprs=None, attrs=None)``."""

    def __init__(self, fn: Any, signature: Any, constexprs: Any = None, attrs: Any = None):
        self.args = ("constexprs", fn, signature, constexprs, attrs)


class OldStyle:
    """Triton 3.3/3.4: ``ASTSource(fn, signature, constants=None, attrs=None)``."""

    def __init__(self, fn: Any, signature: Any, constants: Any = None, attrs: Any = None):
        self.args = ("constants", fn, signature, constants, attrs)


class NoAttrs:
    def __init__(self, fn: Any, signature: Any, constexprs: Any = None):
        self.args = ("constexprs", fn, signature, constexprs, None)


class Unknown:
    def __init__(self, fn: Any, signature: Any, consts: Any = None):
        raise AssertionError("must not be called")


SIG = {"x": "*fp16", "BLOCK": "constexpr"}
ATTRS = {(0,): [["tt.divisibility", 16]]}


@pytest.mark.parametrize("cls", [NewStyle, OldStyle])
def test_constexprs_go_to_whichever_name_the_constructor_has(cls: type) -> None:
    src = make_ast_source(cls, "fn", SIG, {"BLOCK": 64}, ATTRS)
    assert src.args == (src.args[0], "fn", SIG, {"BLOCK": 64}, ATTRS)


def test_attrs_are_dropped_where_the_constructor_has_none() -> None:
    assert make_ast_source(NoAttrs, "fn", SIG, {"BLOCK": 64}, ATTRS).args[3] == {"BLOCK": 64}


def test_an_unknown_constructor_is_refused_with_its_parameters() -> None:
    with pytest.raises(TypeError, match=r"neither 'constexprs' nor 'constants'.*consts"):
        make_ast_source(Unknown, "fn", SIG, {"BLOCK": 64})


def test_installed_triton_accepts_the_shim() -> None:
    pytest.importorskip("triton")
    from triton.compiler import ASTSource

    from volta_devkit.example import rms_norm_kernel

    # ASTSource only reads the argument names here (JIT and interpreted functions have them).
    names = list(rms_norm_kernel.arg_names)
    sig = {a: ("constexpr" if a == "BLOCK_N" else "i32") for a in names}
    src = make_ast_source(ASTSource, rms_norm_kernel, sig, {"BLOCK_N": 1024}, ATTRS)
    # Triton keys constexpr values by argument position.
    assert src.constants == {(names.index("BLOCK_N"),): 1024}
    assert src.attrs == ATTRS
    assert src.signature == sig
