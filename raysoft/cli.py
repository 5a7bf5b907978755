"""Command line: a thin layer over :func:`raysoft.run`.

    raysoft run CONFIG [--set section.key=value ...] [--out DIR] [--address ADDR]
    raysoft run --resume RUN_DIR
    raysoft compare CONFIG [--algorithms fedsoft,ifca,...] [--set ...] [--out DIR]
    raysoft report RUN_DIR [RUN_DIR ...] [--out DIR]

The last line on stdout is the new run (or comparison) directory. A bad config or argument prints one line on
stderr naming the key and the problem, and exits with code 2.
"""

from __future__ import annotations

import argparse
import sys

from .config import ConfigError, load_config, load_raw
from .errors import UpdateError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit code 2
        sys.stderr.write(f"raysoft: error: {message}\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="raysoft", description="Soft- and hard-clustered federated learning on Ray.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    r = sub.add_parser("run", help="run one experiment")
    r.add_argument("config", nargs="?", help="experiment YAML (see jobs/)")
    r.add_argument("--resume", metavar="RUN_DIR", help="continue a checkpointed run from its last checkpoint")
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config value (repeatable)")
    r.add_argument("--out", help="output directory (overrides output.dir)")
    r.add_argument("--address", help="Ray address to join: auto, ray://host:10001 or http://host:8265")
    r.add_argument("--progress", choices=["auto", "bar", "lines", "none"], help="progress display")
    c = sub.add_parser("compare", help="run several algorithms on identical clients and seeds")
    c.add_argument("config", help="experiment YAML (see jobs/compare_fmnist.yaml)")
    c.add_argument("--algorithms", default="fedsoft,ifca,fedem,fedavg,local",
                   help="comma-separated algorithm names (default: %(default)s)")
    c.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    c.add_argument("--out", help="where the comparison directory goes (overrides output.dir)")
    c.add_argument("--address", help="Ray address to join")
    c.add_argument("--progress", choices=["auto", "bar", "lines", "none"])
    sub.add_parser("bench", help="seconds per round against the bare loop and Flower: bench [--workload W2] [--quick]")
    sub.add_parser("report", help="figures and Markdown summaries of finished runs: report RUN_DIR [RUN_DIR ...]")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # raysoft against the bare loop and Flower
        from .bench import main as bench_main

        return bench_main(argv[1:])
    if argv[:1] == ["report"]:  # figures and summaries of finished runs (matplotlib)
        from .report import main as report_main

        return report_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            from .api import resume, run

            if args.resume:
                if args.config or args.overrides or args.out:
                    raise ConfigError("--resume takes the run directory only (its config.yaml is the config)")
                print(resume(args.resume, address=args.address, progress=args.progress).run_dir)
            else:
                if not args.config:
                    raise ConfigError("run: give a CONFIG file (or --resume RUN_DIR)")
                cfg = load_config(args.config, args.overrides)  # validate here, before submitting
                if args.address and args.address.startswith(("http://", "https://")):
                    from .submit import submit  # a Jobs API address: run as a Ray Job there

                    import shlex

                    entry = ["raysoft", "run", shlex.quote(args.config)]
                    for o in args.overrides:
                        entry += ["--set", shlex.quote(o)]
                    entry += ["--out", shlex.quote(args.out)] if args.out else []
                    return submit(args.address, entry)
                print(run(cfg, out=args.out, address=args.address, progress=args.progress).location)
        elif args.command == "compare":
            from .compare import compare

            algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
            raw = load_raw(args.config, args.overrides)
            path = compare(raw, algorithms, out=args.out, progress=args.progress, address=args.address)
            print((path / "comparison.md").read_text(), end="")
            print(path)
    except ConfigError as err:
        sys.stderr.write(f"raysoft: error: {err}\n")
        return 2
    except UpdateError as err:
        sys.stderr.write(f"raysoft: run stopped: {err}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
