"""``ptrain tune``: the command. Every ``fit`` flag and config key applies; its own flags
start with ``--tune-``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ptrain.config import to_seconds
from ptrain.errors import ConfigError, ModelError


def duration(text: str) -> float:
    """Seconds from ``--tune-budget``'s text: any duration :func:`ptrain.config.to_seconds`
    takes (``600``, ``90s``, ``10m``, ``1.5h``)."""
    try:
        return to_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--tune-budget {text!r} is not a duration: "
                                         f"{exc}") from None


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def tune_parser() -> argparse.ArgumentParser:
    from ptrain.cli import _Parser

    parser = _Parser(prog="ptrain tune", add_help=False, description=(
        "Train your model on your data with every speed-up the installed plugins offer, each "
        "measured against your configuration in interleaved repeats, and write the fastest "
        "configuration that trains the same as a config file. Every `ptrain fit` option "
        "applies (ptrain fit --help lists them); nothing is trained or saved beyond the "
        "measurement."))
    parser.add_argument("--tune-budget", type=duration, default=600.0, metavar="TIME",
                        help="time for the whole tune: seconds or 90s, 10m, 1h (default 10m)")
    parser.add_argument("--tune-only", type=_names, metavar="SETTINGS",
                        help="tune only these settings, comma-separated (e.g. precision,compile)")
    parser.add_argument("--tune-skip", type=_names, metavar="SETTINGS",
                        help="leave these settings as they are, comma-separated")
    parser.add_argument("--tune-steps", type=_positive, metavar="N",
                        help="optimizer steps measured per trial (default: at least 30, and "
                             "as many as take about 1 s of your configuration's training)")
    parser.add_argument("--tune-warmup", type=_positive, default=5, metavar="N",
                        help="optimizer steps run before the clock starts, per trial; compile "
                             "and finder searches happen here and are reported apart (default 5)")
    parser.add_argument("--tune-repeats", type=_positive, default=3, metavar="N",
                        help="interleaved repeats of every candidate and of your configuration, "
                             "at most (the budget may allow fewer; at least 2; default 3)")
    parser.add_argument("--tune-output", type=Path, default=Path("tuned.toml"), metavar="FILE",
                        help="the config file to write (default tuned.toml; a file ptrain tune "
                             "did not write is never replaced)")
    parser.add_argument("-h", "--help", action="store_true", help="show this help")
    return parser


def cmd_tune(argv: list[str]) -> int:
    from rich.console import Console

    from ptrain import cli
    from ptrain.catalog import Catalog
    from ptrain.config import dump_config
    from ptrain.module import DataModule, TrainModule
    from ptrain.tuning import report
    from ptrain.tuning.candidates import RunConfig
    from ptrain.trainer import Trainer
    from ptrain.tuning.run import tune

    parser = tune_parser()
    args, rest = parser.parse_known_args(argv)
    if args.help:
        parser.print_help()
        return 0
    if args.tune_repeats < 2:
        raise ConfigError("--tune-repeats must be at least 2: one repeat can't measure the noise")
    catalog = Catalog.discover()
    spec = cli.resolve_run("fit", rest, catalog, also=[parser])
    cli.freeze_imported()
    for flag, given, why in (
            ("--print-config", spec.print_config, "ptrain tune writes the configuration that won "
             "to --tune-output; `ptrain fit --print-config` shows the one you give it"),
            ("--trace", spec.trace, "it would print every hook call of every trial; trace one "
             "run with `ptrain fit --trace`")):
        if given:
            raise ConfigError(f"ptrain tune does not take {flag}: {why}.")
    if spec.ckpt_path:
        raise ConfigError("ptrain tune measures training from the start, so it takes no "
                          "--ckpt-path (nor ckpt_path in the config); leave it out. The "
                          "configuration it writes resumes like any other (ptrain fit --config "
                          "tuned.toml --ckpt-path ...).")
    if not spec.model.get("class_path"):
        raise ModelError("no model given: pass --model MODULE:CLASS (a ptrain.TrainModule) or "
                         "set class_path in the [model] table of --config.")
    report.check_output(args.tune_output)

    def components():
        module = cli.build_component(spec.model, TrainModule, "--model")
        data = cli.build_component(spec.data, DataModule, "--data") if spec.data else None
        return module, data

    console = Console(stderr=True)
    trials = 0
    with console.status("ptrain tune: starting") as status:
        def progress(label: str) -> None:
            nonlocal trials
            trials += 1
            status.update(f"ptrain tune: trial {trials}: {label}")

        outcome = tune(RunConfig(spec.trainer_options, spec.plugin_options), components,
                       catalog=catalog, budget_s=args.tune_budget, warmup=args.tune_warmup,
                       steps=args.tune_steps, repeats=args.tune_repeats, only=args.tune_only,
                       skip=args.tune_skip, progress=progress)
    out = Console(file=sys.stdout, width=max(120, Console().width))
    out.print(report.table(outcome))
    for note in outcome.notes:
        out.print(f"note: {note}", highlight=False)
    winning = Trainer(plugin_options={k: dict(v) for k, v in outcome.config.plugin_options.items()},
                      catalog=catalog, **outcome.config.trainer)
    winning.config.update(model=spec.model, data=spec.data)
    report.write_config(outcome, dump_config(winning.config), args.tune_output)
    out.print(report.summary(outcome, args.tune_output), highlight=False)
    return 0


__all__ = ["cmd_tune", "duration", "tune_parser"]
