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
from typing import TYPE_CHECKING, NoReturn

from volta_core import __version__
from volta_core.device import parse_device
from volta_core.errors import UsageError, VoltaError
from volta_core.host.checkpoint import ignore_match_budget
from volta_core.host.discovery import get_plugin_manager
from volta_core.host.records import PluginRecord

if TYPE_CHECKING:
    from volta_core.planner.estimate import SpeedAssumptions

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2

#: Seconds one command may spend matching a checkpoint's ``ignore`` patterns, in all.
IGNORE_MATCH_SECONDS = 2.0


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
    plan.add_argument(
        "--tensor-parallel-size", "-tp", type=int, default=None, help="default: --gpus"
    )
    plan.add_argument("--block-size", type=int, default=16)
    plan.add_argument("--attention-backend", default=None)
    plan.add_argument("--json", action="store_true", help="print JSON")
    _add_fit_arguments(plan)
    _add_serve_arguments(plan)
    sub.add_parser("examples", help="list the bundled example configs")
    doctor = sub.add_parser(
        "doctor", help="check this machine (GPUs, torch, vLLM, Triton, plugins) for serving on SM70"
    )
    doctor.add_argument("--model", default=None, help="also plan this model on sm70")
    doctor.add_argument(
        "--tensor-parallel-size",
        "-tp",
        type=int,
        default=None,
        help="the plan's: the interconnect is judged for the GPUs it runs on (default: every "
        "visible GPU)",
    )
    doctor.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.9,
        help="the plan's: each GPU needs this share of its memory free (default 0.9)",
    )
    doctor.add_argument("--json", action="store_true", help="print JSON")
    _add_bench_parser(sub)
    _add_warmup_parser(sub)
    return parser


def _add_warmup_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    """``warmup``: the plan's options that choose the plugins, and which builds to compile."""
    warmup = sub.add_parser(
        "warmup",
        help="compile the kernels a model's plan launches into Triton's and the NVRTC caches",
    )
    warmup.add_argument("model", help="model directory, config.json, or bundled example name")
    warmup.add_argument("--device", default="sm70", help="compute capability (default sm70)")
    warmup.add_argument("--dtype", default="auto")
    warmup.add_argument("--kv-cache-dtype", default="auto")
    warmup.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    warmup.add_argument("--block-size", type=int, default=16)
    warmup.add_argument("--attention-backend", default=None)
    warmup.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="PATTERN",
        help="compile only builds whose PLUGIN:NAME matches this shell pattern (repeatable)",
    )
    warmup.add_argument(
        "--jobs",
        "-j",
        type=int,
        default=None,
        help="compile processes (default: one per 32 builds, at most the CPUs and 8)",
    )
    warmup.add_argument("--json", action="store_true", help="print JSON")


def _add_bench_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    """``bench``: the model (or the default set), how long, and where the report goes."""
    bench = sub.add_parser(
        "bench",
        help="time this GPU's ceilings and the kernels a model's plan names beside their estimates",
    )
    bench.add_argument(
        "model", nargs="*", help="model directory, config.json or bundled example (default: a set)"
    )
    bench.add_argument("--quick", action="store_true", help="fewer points, under a minute")
    bench.add_argument(
        "--dtype", default="float16", help="activation dtype (default float16, as a V100 runs)"
    )
    bench.add_argument("--kv-cache-dtype", default="auto")
    bench.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="load this plugin module (volta_attn_v100.plugin) instead of the installed ones: "
        "a source checkout on PYTHONPATH (repeatable)",
    )
    bench.add_argument("--json", action="store_true", help="print the JSON report")
    bench.add_argument(
        "--out", default=None, help="write the JSON report here (a folder: bench.json and .txt)"
    )


def _add_fit_arguments(plan: argparse.ArgumentParser) -> None:
    """The memory fit's and the speed estimate's options of ``plan``."""
    from volta_core.planner.estimate import SpeedAssumptions
    from volta_core.planner.fit import (
        DEFAULT_MAX_NUM_BATCHED_TOKENS,
        DEFAULT_MAX_NUM_SEQS,
        V100_32GB,
    )

    fit = plan.add_argument_group("memory fit (per rank)")
    fit.add_argument(
        "--gpus", type=int, default=None, help="GPUs in the box (default: the TP size, or 1)"
    )
    fit.add_argument(
        "--gpu-memory",
        default=V100_32GB,
        help=f"memory of each GPU (default {V100_32GB}: a V100-32GB; 16160MiB: a V100-16GB)",
    )
    fit.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    fit.add_argument("--max-model-len", type=int, default=None, help="default: the model's")
    fit.add_argument("--max-num-seqs", type=int, default=DEFAULT_MAX_NUM_SEQS)
    fit.add_argument("--max-num-batched-tokens", type=int, default=DEFAULT_MAX_NUM_BATCHED_TOKENS)
    speed = plan.add_argument_group("decode and prefill speed estimate (V100)")
    speed.add_argument("--batch", type=int, default=1, help="sequences decoded together")
    speed.add_argument("--context", type=int, default=None, help="default: --max-model-len")
    speed.add_argument(
        "--prompt-tokens",
        type=int,
        default=None,
        help="prompt length whose prefill (time to first token) is estimated, in chunks of "
        "--max-num-batched-tokens (default: --context)",
    )
    speed.add_argument(
        "--speculative-tokens", type=int, default=0, help="MTP draft tokens per step (default 0)"
    )
    speed.add_argument(
        "--acceptance",
        type=float,
        default=0.7,
        help="accepted / drafted MTP tokens, as vLLM's metrics report (default 0.7)",
    )
    a = SpeedAssumptions()
    speed.add_argument("--hbm-gbps", type=float, default=a.hbm_gbps)
    speed.add_argument("--pcie-gbps", type=float, default=a.pcie_gbps)
    speed.add_argument("--allreduce-us", type=float, default=a.allreduce_us)
    speed.add_argument("--launch-us", type=float, default=a.launch_us)
    speed.add_argument(
        "--calibration",
        default=None,
        metavar="GPU",
        help="price with a measured GPU's rates (a name in the calibration table, from a "
        "vllm-volta bench report) instead of the V100 whitepaper's",
    )


def _add_serve_arguments(plan: argparse.ArgumentParser) -> None:
    """The options of the serve command ``plan`` ends with."""
    from volta_core.planner.serve import INTERCONNECTS

    serve = plan.add_argument_group("serve command")
    serve.add_argument(
        "--interconnect",
        choices=INTERCONNECTS,
        default="pcie",
        help="between the GPUs (default pcie: PCIe cards without NVLink, as most V100 boxes "
        "are; tensor parallelism over PCIe gets NCCL_P2P_DISABLE=1 and "
        "--disable-custom-all-reduce)",
    )


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
    from pathlib import Path

    from volta_core.planner.capacity import SpeedRequest, assess
    from volta_core.planner.fit import FitOptions, parse_size
    from volta_core.planner.model import describe_model, read_config
    from volta_core.planner.plan import PlanOptions, make_plan, plan_as_dict, render_text
    from volta_core.planner.serve import ServeOptions, serve_commands
    from volta_core.vllm.families import installed_family_name

    # Either defaults to the other: -tp 2 alone plans two GPUs, --gpus 2 alone plans TP 2.
    gpus = args.gpus if args.gpus is not None else (args.tensor_parallel_size or 1)
    tp = args.tensor_parallel_size if args.tensor_parallel_size is not None else gpus
    if tp > gpus:
        raise UsageError(f"--tensor-parallel-size {tp} needs --gpus {tp} or more (not {gpus})")
    fit_options = FitOptions(
        gpus=gpus,
        gpu_memory=parse_size(args.gpu_memory),
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        speculative_tokens=args.speculative_tokens,
    )
    speed = SpeedRequest(
        args.batch,
        args.context,
        args.speculative_tokens,
        args.acceptance,
        _speed_assumptions(args),
        args.prompt_tokens,
    )
    options = PlanOptions(
        device=parse_device(args.device),
        dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype,
        tensor_parallel_size=tp,
        block_size=args.block_size,
        attention_backend=args.attention_backend,
        engine_family=installed_family_name(),
    )
    name, raw = read_config(args.model)
    model = describe_model(name, raw)
    manager = get_plugin_manager()
    plan = make_plan(model, options, manager)
    directory = Path(args.model)
    checkpoint = directory if directory.is_dir() else None
    capacity = assess(plan, model, raw, fit_options, speed, manager, checkpoint)
    target = checkpoint or (directory.parent if directory.is_file() else None)
    where = ServeOptions(
        str(target) if target is not None else args.model,
        args.interconnect,
        options.engine_family,
        example=target is None,
    )
    serve = serve_commands(plan, capacity.fit, fit_options, manager, where)
    if args.json:
        print(
            json.dumps(
                plan_as_dict(plan) | capacity.as_dict() | {"serve": serve.as_dict()}, indent=2
            )
        )
    else:
        print(render_text(plan, capacity.sections()) + "\n\n" + "\n".join(serve.lines()))
    return EXIT_PROBLEMS if plan.problems else EXIT_OK


def _speed_assumptions(args: argparse.Namespace) -> SpeedAssumptions:
    """The estimate's assumptions from ``plan``'s options: a ``--calibration`` sets the HBM
    bandwidth, so it cannot be given with ``--hbm-gbps`` too."""
    from volta_core.planner.calibration import calibration_for
    from volta_core.planner.estimate import SpeedAssumptions

    assumptions = SpeedAssumptions(
        hbm_gbps=args.hbm_gbps,
        pcie_gbps=args.pcie_gbps,
        allreduce_us=args.allreduce_us,
        launch_us=args.launch_us,
    )
    if args.calibration is None:
        return assumptions
    if args.hbm_gbps != SpeedAssumptions().hbm_gbps:
        raise UsageError("--calibration sets the HBM bandwidth: leave out --hbm-gbps")
    return assumptions.calibrated(calibration_for(args.calibration))


def _cmd_examples(_args: argparse.Namespace) -> int:
    from volta_core.planner.model import example_names

    print("\n".join(example_names()))
    return EXIT_OK


def _cmd_doctor(args: argparse.Namespace) -> int:
    from volta_core.doctor.checks import load_model, run_checks
    from volta_core.planner.fit import FitOptions

    tp = args.tensor_parallel_size
    if tp is not None and tp < 1:
        raise UsageError(f"--tensor-parallel-size must be at least 1, not {tp}")
    fit = FitOptions(gpu_memory_utilization=args.gpu_memory_utilization)
    model = load_model(args.model) if args.model is not None else None
    report = run_checks(get_plugin_manager, model, tensor_parallel_size=tp, fit=fit)
    print(json.dumps(report.as_dict(), indent=2) if args.json else report.render())
    return EXIT_PROBLEMS if report.problems else EXIT_OK


def _cmd_warmup(args: argparse.Namespace) -> int:
    from volta_core.planner.model import describe_model, read_config
    from volta_core.planner.plan import PlanOptions, make_plan
    from volta_core.vllm.families import installed_family_name
    from volta_core.warmup import check_environment, run_warmup

    check_environment()
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, not {args.jobs}")
    options = PlanOptions(
        device=parse_device(args.device),
        dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype,
        tensor_parallel_size=args.tensor_parallel_size,
        block_size=args.block_size,
        attention_backend=args.attention_backend,
        engine_family=installed_family_name(),
    )
    name, raw = read_config(args.model)
    manager = get_plugin_manager()
    plan = make_plan(describe_model(name, raw), options, manager)
    try:
        report = run_warmup(plan, manager, only=args.only, jobs=args.jobs)
    except KeyboardInterrupt:
        print("vllm-volta: warmup interrupted; what it compiled stays cached", file=sys.stderr)
        return EXIT_PROBLEMS
    print(json.dumps(report.as_dict(), indent=2) if args.json else report.render())
    return EXIT_PROBLEMS if report.failed or report.problems else EXIT_OK


def _cmd_bench(args: argparse.Namespace) -> int:
    from pathlib import Path

    from volta_core.bench.report import render_text
    from volta_core.bench.run import load_plugins, run_bench

    report = run_bench(
        args.model,
        quick=args.quick,
        dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype,
        manager=load_plugins(args.plugin) if args.plugin else get_plugin_manager(),
    )
    text = json.dumps(report, indent=2)
    summary = render_text(report)
    if args.out is not None:
        out = Path(args.out)
        if out.is_dir() or args.out.endswith("/"):
            out.mkdir(parents=True, exist_ok=True)
            (out / "bench.txt").write_text(summary + "\n")
            out = out / "bench.json"
        out.write_text(text + "\n")
    print(text if args.json else summary)
    return EXIT_OK


_COMMANDS = {
    "plugins": _cmd_plugins,
    "plan": _cmd_plan,
    "examples": _cmd_examples,
    "doctor": _cmd_doctor,
    "bench": _cmd_bench,
    "warmup": _cmd_warmup,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``vllm-volta`` console script."""
    logging.basicConfig(level=logging.WARNING, format="vllm-volta: %(levelname)s: %(message)s")
    try:
        args = _parser().parse_args(argv)
        with ignore_match_budget(IGNORE_MATCH_SECONDS):
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
