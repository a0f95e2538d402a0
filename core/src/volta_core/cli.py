"""The ``vllm-volta`` command: ``plugins`` lists what is installed, ``plan`` explains a model.

Bad input (a missing or unreadable path, malformed JSON, a config field of the wrong type, an
unknown example, dtype, device, attention backend or ``VLLM_VOLTA_PLUGINS`` value) is one line on
stderr and exit code 2, never a traceback. A plan that finds something the engine would refuse
(in the config, in the resolutions, or a plugin failing in a hook) exits 1 after printing the
whole plan. Exit codes are only ever 0, 1 and 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import NoReturn

from volta_core import __version__
from volta_core.device import parse_device
from volta_core.errors import UsageError, VoltaError
from volta_core.manager import PluginRecord, get_plugin_manager

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="vllm-volta", description="vLLM on NVIDIA V100 (SM70): plugins and plans")
    parser.add_argument("--version", action="version", version=f"vllm-volta-core {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    plugins = sub.add_parser(
        "plugins", help="list discovered plugins, their status and what they provide"
    )
    plugins.add_argument("--json", action="store_true", help="print JSON")
    plan = sub.add_parser("plan", help="show what the engine would do with a model on a device")
    plan.add_argument("model", help="model directory, config.json, or bundled example name")
    plan.add_argument(
        "--device", default="sm70", help="compute capability: sm70 (default), sm_89, 9.0..."
    )
    plan.add_argument("--dtype", default="auto")
    plan.add_argument("--kv-cache-dtype", default="auto")
    plan.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    plan.add_argument("--block-size", type=int, default=16)
    plan.add_argument("--attention-backend", default=None)
    plan.add_argument("--json", action="store_true", help="print JSON")
    sub.add_parser("examples", help="list the bundled example configs")
    doctor = sub.add_parser(
        "doctor", help="check this machine (GPUs, torch, vLLM, Triton, plugins) for serving on SM70"
    )
    doctor.add_argument("--model", default=None, help="also plan this model on sm70")
    doctor.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _plugin_lines(records: Sequence[PluginRecord]) -> list[str]:
    if not records:
        return ["no vllm-volta plugins installed"]
    lines = []
    for r in records:
        label = f"{r.distribution} {r.version}".strip() or "unknown distribution"
        lines.append(f"{r.name}  {label}  {r.status.value}")
        if r.error:
            lines.append(f"    reason: {' '.join(r.error.split())}")
        for family, names in r.provides.items():
            lines.append(f"    {family}: {', '.join(names)}")
        hooks = [
            h
            for h in r.hooks
            if h
            not in {"volta_attention_backends", "volta_quant_methods", "volta_reasoning_parsers"}
        ]
        if hooks:
            lines.append(f"    hooks: {', '.join(hooks)}")
    return lines


def _cmd_plugins(args: argparse.Namespace) -> int:
    records = sorted(get_plugin_manager().records.values(), key=lambda r: r.name)
    if args.json:
        print(json.dumps([r.as_dict() for r in records], indent=2))
    else:
        print("\n".join(_plugin_lines(records)))
    return EXIT_OK


def _cmd_plan(args: argparse.Namespace) -> int:
    from volta_core.model import describe_model, read_config
    from volta_core.plan import PlanOptions, make_plan, plan_as_dict, render_text

    options = PlanOptions(
        device=parse_device(args.device),
        dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype,
        tensor_parallel_size=args.tensor_parallel_size,
        block_size=args.block_size,
        attention_backend=args.attention_backend,
    )
    name, raw = read_config(args.model)
    plan = make_plan(describe_model(name, raw), options, get_plugin_manager())
    print(json.dumps(plan_as_dict(plan), indent=2) if args.json else render_text(plan))
    return EXIT_PROBLEMS if plan.problems else EXIT_OK


def _cmd_examples(_args: argparse.Namespace) -> int:
    from volta_core.model import example_names

    print("\n".join(example_names()))
    return EXIT_OK


def _cmd_doctor(args: argparse.Namespace) -> int:
    from volta_core.doctor import load_model, run_checks

    model = load_model(args.model) if args.model is not None else None
    report = run_checks(get_plugin_manager, model)
    print(json.dumps(report.as_dict(), indent=2) if args.json else report.render())
    return EXIT_PROBLEMS if report.problems else EXIT_OK


_COMMANDS = {
    "plugins": _cmd_plugins,
    "plan": _cmd_plan,
    "examples": _cmd_examples,
    "doctor": _cmd_doctor,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``vllm-volta`` console script."""
    logging.basicConfig(level=logging.WARNING, format="vllm-volta: %(levelname)s: %(message)s")
    try:
        args = _parser().parse_args(argv)
        return _COMMANDS[args.command](args)
    except UsageError as exc:
        print(f"vllm-volta: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except VoltaError as exc:
        print(f"vllm-volta: error: {exc}", file=sys.stderr)
        return EXIT_PROBLEMS
    except Exception as exc:  # a bug, not the user's input: still one line, still exit 0/1/2
        detail = " ".join(str(exc).split())[:300]
        print(f"vllm-volta: internal error: {type(exc).__name__}: {detail}", file=sys.stderr)
        return EXIT_PROBLEMS


if __name__ == "__main__":
    sys.exit(main())
