"""The README's GDN-on-sm_70 table is what render_table.py makes of the committed reports, its
estimated times the planner's: a change to the reports or to the planner's Gated DeltaNet cost
model that is not rendered into the README fails here."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).parent


def _render_table() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_table", HERE / "render_table.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_table_is_the_rendered_reports(tmp_path: Path) -> None:
    render = _render_table()
    readme = render.ROOT / "README.md"
    copy = tmp_path / "README.md"
    copy.write_text(readme.read_text())
    assert render.main(["--write", str(copy)]) == 0
    assert copy.read_text() == readme.read_text(), (
        "README.md's GDN table is stale: python tests/gdn_sm70/render_table.py --write README.md"
    )
    prefill = render.estimate("chunk_fwd_kernel_o", "prefill (27B TP1)")
    assert prefill.endswith("us (FMA)")
    assert render.estimate("chunk_fwd_kernel_o", "prefill (35B-A3B TP1)") == "-"
