"""Command line: every subcommand's arguments, parsed here; the work is done by plain functions.

    raysoft run CONFIG [--set section.key=value ...] [--out DIR] [--address ADDR]
    raysoft run --resume RUN_DIR
    raysoft compare CONFIG [--algorithms fedsoft,ifca,...] [--set ...] [--out DIR]
    raysoft compare --resume COMPARE_DIR
    raysoft report RUN_DIR [RUN_DIR ...] [--out DIR]
    raysoft bench [--workload W1,W2,W3] [--rounds N] [--out DIR] [--quick] [--flower DIR|skip] [--pfl DIR|skip]
                  [--long-run] [--timeout S] [--device cpu|cuda] [--gpu-share S]
    raysoft sweep SWEEP [--out DIR] [--address ADDR] | raysoft sweep --resume SWEEP_DIR
    raysoft list [algorithms|models|datasets|callbacks] [NAME ...]
    raysoft submit [--address http://HOST:8265] [--working-dir DIR] -- raysoft run CONFIG ...
    raysoft new NAME [--kind algorithm|dataset] [--out DIR]
    raysoft example [NAME|jobs] [--out DIR]
    raysoft --version

``run`` and ``compare`` call :func:`raysoft.run` and :func:`raysoft.compare.compare`; ``report``
and ``bench`` call :func:`raysoft.report.main` and :func:`raysoft.bench.main` with the parsed
values (``python -m raysoft.report`` and ``python -m raysoft.bench`` come here too). The last
line on stdout is the new run (or comparison, report, bench) directory. A bad config or argument
prints one line on stderr naming the key and the problem, and exits with code 2. A run stopped by its own
failure after it had results (a non-finite update, a failure writing them) prints one line saying where
they are and exits with code 1; SIGTERM or Ctrl-C prints one line saying what was kept and exits with
128 + the signal's number. ``--traceback`` (or ``RAYSOFT_TRACEBACK=1``) writes an error's whole
traceback before its one line.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import NoReturn

from .bench.peers import peer_venv
from .config import COMPARE_DEFAULT, ConfigError, load_config, load_raw
from .errors import RaysoftError, error_line, exit_code, full_traceback
from .options import add_cluster, add_overrides, add_progress, add_traceback, wants_traceback


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument as one line on stderr (``<error_prefix>: error: ...``)
    and exit code 2."""

    def __init__(self, *args, error_prefix: str = "raysoft", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.error_prefix = error_prefix

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.error_prefix}: error: {message}\n")
        raise SystemExit(2)

    def parse_args(self, args=None, namespace=None):
        # the top parser finds a subcommand's unknown arguments: report them in the subcommand's name
        ns, extra = self.parse_known_args(args, namespace)
        if extra:
            getattr(ns, "subparser", self).error(f"unrecognized arguments: {' '.join(extra)}")
        return ns


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="raysoft", description="Soft- and hard-clustered federated learning on Ray.")
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="raysoft's version (and git commit in a checkout), Ray's, torch's and Python's")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    r = sub.add_parser("run", help="run one experiment")
    r.add_argument("config", nargs="?", help="experiment YAML (raysoft example lists the shipped ones; jobs/NAME.yaml "
                                           "is found from any folder; a config of {} runs on every default)")
    r.add_argument("--resume", metavar="RUN_DIR", help="continue a checkpointed run from its last checkpoint")
    add_overrides(r)
    r.add_argument("--out", help="output directory (overrides output.dir)")
    add_cluster(r, jobs_api=True)
    add_progress(r)
    c = sub.add_parser("compare", help="run several algorithms on identical clients and seeds")
    c.add_argument("config", nargs="?", help="experiment YAML (see jobs/compare_fmnist.yaml)")
    c.add_argument("--algorithms", help=f"comma-separated algorithm names (default: {','.join(COMPARE_DEFAULT)})")
    c.add_argument("--resume", metavar="COMPARE_DIR",
                   help="continue an interrupted comparison: keep its finished runs, resume its checkpointed "
                        "ones, run the rest")
    add_overrides(c)
    c.add_argument("--out", help="where the comparison directory goes (overrides output.dir)")
    add_cluster(c)
    add_progress(c)
    rp = sub.add_parser("report", help="figures and Markdown summaries of finished runs",
                        description="Figures and Markdown summaries of finished runs.", error_prefix="raysoft report")
    rp.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                    help="run directories (as `raysoft run` prints), `raysoft compare` directories (their runs), "
                         "or one `raysoft sweep` directory (its table and a figure of the metric over the grid)")
    rp.add_argument("--out", help="where comparison_report.md goes when several runs are given "
                                  "(default: the first run's parent directory)")
    b = sub.add_parser("bench", help="seconds per round against the bare loop, Flower and pfl",
                       description="Seconds per round of raysoft against the bare loop, Flower and pfl (their "
                                   "harnesses: the benchmarks/ folder of a raysoft checkout, or $RAYSOFT_BENCHMARKS).",
                       error_prefix="raysoft bench")
    b.add_argument(
        "--workload", default="W1,W2,W3",
        help="comma-separated: W1, W2, W3, W4, W5 (default: W1-W3; W4 is N = 1,000, W5 FedAvg at N = 10,000)"
    )
    b.add_argument("--rounds", type=int, help="rounds to time (default: W1 6, W2 6; W3 200 uploads, "
                                              "or this many rounds of N uploads)")
    b.add_argument("--out", default="runs/bench", help="where bench.parquet goes (default: %(default)s)")
    b.add_argument("--quick", action="store_true", help="a small version of each workload (a smoke test)")
    b.add_argument("--clients", type=int, help="W4's population N (default 1,000; the scaling table)")
    b.add_argument("--long-run", action="store_true",
                   help="raysoft alone, for many rounds (W1 1,000, W2 100, W3 2,000 uploads), its memory over "
                        "time: memory.parquet, memory.md, memory.png")
    b.add_argument("--timeout", type=float, default=7200.0,
                   help="seconds one measurement may take before it is stopped, exit 1 (default: %(default)g)")
    b.add_argument("--flower", default=str(peer_venv("flower")),
                   help="the Flower virtual environment (created on first use), or 'skip' (default: %(default)s)")
    b.add_argument("--pfl", default=str(peer_venv("pfl")),
                   help="the virtual environment of pfl 0.6.0, Apple's pfl-research, the peer of W1 and W2 "
                        "(created on first use), or 'skip' (default: %(default)s)")
    b.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="cuda: every system on the GPU, a GPU floor row, the GPU's utilisation and memory per "
                        "row; refused where torch finds no CUDA (default: %(default)s)")
    b.add_argument("--gpu-share", type=float, default=0.125,
                   help="--device cuda: the share of the GPU each client actor of raysoft and Flower asks for "
                        "(ray.num_gpus_per_actor; 1/share actors on the GPU; default: %(default)g)")
    # one measurement in a subprocess of raysoft bench: SYSTEM WORKLOAD ROUNDS QUICK(1/0) OUT_JSON [EXPORT]
    b.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    sw = sub.add_parser("sweep", help="a grid of runs (seeds included) as Ray Tune trials")
    sw.add_argument("sweep", nargs="?", metavar="SWEEP", help="sweep YAML (see jobs/sweep_example.yaml)")
    sw.add_argument("--resume", metavar="SWEEP_DIR", help="continue an interrupted sweep")
    sw.add_argument("--out", help="where the sweep directory goes (default: the base config's output.dir)")
    add_cluster(sw)
    ls = sub.add_parser("list", help="the algorithms, models, datasets and callbacks a config can name, with "
                                     "every setting")
    ls.add_argument("kind", nargs="?", choices=["algorithms", "models", "datasets", "callbacks"],
                    help="one kind (default: all four)")
    ls.add_argument("names", nargs="*", metavar="NAME",
                    help="only these (built-in or registered names, or import paths module:Name)")
    sub.add_parser("submit", help="run a command as a Ray Job, uploading the working directory: raysoft submit "
                                  "[--address http://HOST:8265] [--working-dir DIR] -- raysoft run CONFIG ...",
                   add_help=False)  # its arguments are raysoft.submit's own (raysoft submit --help)
    nw = sub.add_parser("new", help="a new project: a plug-in that already runs, its job YAML, a README, a test",
                        description="Write a folder NAME with NAME.py (a plug-in importing raysoft.sdk that already "
                                    "runs), job.yaml, README.md (the two commands) and test_NAME.py.")
    nw.add_argument("name", metavar="NAME", help="the project and its module's name (a Python identifier)")
    nw.add_argument("--kind", default="algorithm", choices=["algorithm", "dataset"],
                    help="the plug-in to start from (default: %(default)s)")
    nw.add_argument("--out", help="the folder to write (default: ./NAME)")
    ex = sub.add_parser("example", help="list the jobs and examples shipped with raysoft, or write one out",
                        description="Without NAME: the shipped jobs and examples. NAME: write example NAME "
                                    "(a plug-in beside its job.yaml) into ./NAME; jobs: the job configs into ./jobs.")
    ex.add_argument("name", nargs="?", metavar="NAME", help="an example's name, or jobs")
    ex.add_argument("--out", help="the folder to write (default: ./NAME)")
    for p in (r, c, sw, ls, nw, ex):
        add_traceback(p)
    for p in (r, c, rp, b, sw, ls, nw, ex):
        p.set_defaults(subparser=p)
    return parser


def _bench(args: argparse.Namespace) -> int:
    from .bench import main as bench_main
    from .bench import worker

    if args.worker:
        if len(args.worker) not in (5, 6):
            sys.stderr.write("raysoft bench: error: --worker takes SYSTEM WORKLOAD ROUNDS QUICK OUT_JSON [EXPORT]\n")
            return 2
        system, workload, rounds, quick, out, *export = args.worker
        return worker(system, workload, int(rounds), quick == "1", Path(out), Path(export[0]) if export else None,
                      args.device, args.gpu_share)
    workloads = [w.strip() for w in args.workload.split(",") if w.strip()]
    if args.long_run:
        from .bench.longrun import main as long_main

        if args.device != "cpu":
            sys.stderr.write("raysoft bench: --device cuda: not with --long-run (it measures raysoft on the CPU)\n")
            return 2

        return long_main(workloads, args.rounds, args.out, args.quick, args.timeout)
    return bench_main(workloads, args.rounds, args.out, args.quick, args.flower, args.clients, args.pfl,
                      args.timeout, args.device, args.gpu_share)


def _report(args: argparse.Namespace) -> int:
    """``raysoft report``: runs and comparisons (:mod:`raysoft.report`), or one sweep directory
    (its table and its figure of the metric over the grid, :mod:`raysoft.sweep_report`)."""
    from .sweep_report import is_sweep_dir, report_sweep

    if len(args.run_dirs) == 1 and is_sweep_dir(args.run_dirs[0]):
        try:
            written = report_sweep(args.run_dirs[0])
        except RaysoftError as err:
            sys.stderr.write(f"raysoft report: {error_line(err)}\n")
            return exit_code(err)
        print(written[0].read_text(), end="")
        for path in written:
            print(path)
        return 0
    from .report import main as report_main

    return report_main(args.run_dirs, args.out)


class _Version(argparse.Action):
    """``--version``: computed when asked for (it may run git), printed, exit 0."""

    def __call__(self, parser, namespace, values, option_string=None) -> NoReturn:
        from .provenance import version_line

        print(version_line())
        raise SystemExit(0)


def _writers(args: argparse.Namespace) -> int:
    """``raysoft list``, ``raysoft new`` and ``raysoft example`` (the folder written is the last
    line on stdout)."""
    if args.command == "list":
        from .listing import main as list_main

        return list_main(args.kind, args.names)
    if args.command == "new":
        from .scaffold import new_project

        path = new_project(args.name, args.kind, args.out)
        print(f"cd {path} && raysoft run job.yaml      # then: python -m pytest test_{args.name}.py")
        print(path)
        return 0
    from .shipped import listing, write_out

    if args.name is None:
        print(listing(), end="")
        return 0
    path = write_out(args.name, args.out)
    if args.name != "jobs":
        print(f"cd {path} && raysoft run job.yaml      # its README.md says more")
    print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["submit"]:  # everything after it is raysoft.submit's (its entrypoint after --)
        from .submit import main as submit_main

        return submit_main(argv[1:], prog="raysoft submit")
    args = build_parser().parse_args(argv)
    if args.command in ("report", "bench"):  # figures of finished runs; raysoft against the bare loop and Flower
        return _report(args) if args.command == "report" else _bench(args)
    try:
        if getattr(args, "token_file", None):
            from .backends import auth

            auth.use_token_file(args.token_file)
        if args.command in ("new", "example", "list"):
            return _writers(args)
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
                    from .api import job_output_dir
                    from .submit import submit  # a Jobs API address: run as a Ray Job there

                    out = job_output_dir(args.out or cfg.output.dir, args.address)

                    entry = ["raysoft", "run", args.config]
                    for o in args.overrides:
                        entry += ["--set", o]
                    entry += ["--out", out]
                    return submit(args.address, entry, join_timeout_s=cfg.ray.join_timeout_s)
                print(run(cfg, out=args.out, address=args.address, progress=args.progress).location)
        elif args.command == "sweep":
            from .sweep import sweep

            if args.resume and (args.sweep or args.out):
                raise ConfigError("--resume takes the sweep directory only")
            path = sweep(args.sweep, out=args.out, address=args.address, resume=args.resume)
            print((path / "sweep.md").read_text(), end="")
            print(path)
        elif args.command == "compare":
            from .compare import compare, resume_compare

            if args.resume:
                if args.config or args.overrides or args.out or args.algorithms:
                    raise ConfigError("--resume takes the comparison directory only (its compare.yaml is the config)")
                path = resume_compare(args.resume, progress=args.progress, address=args.address)
            else:
                if not args.config:
                    raise ConfigError("compare: give a CONFIG file (or --resume COMPARE_DIR)")
                algorithms = [a.strip() for a in (args.algorithms or ",".join(COMPARE_DEFAULT)).split(",")
                              if a.strip()]
                raw = load_raw(args.config, args.overrides)
                path = compare(raw, algorithms, out=args.out, progress=args.progress, address=args.address)
            print((path / "comparison.md").read_text(), end="")
            print(path)
    except RaysoftError as err:  # a refusal (exit 2) or a run that stopped (exit 1)
        if wants_traceback(args):  # the whole traceback first, the one line last
            sys.stderr.write(full_traceback(err))
        sys.stderr.write(f"raysoft: {err.kind}: {error_line(err)}\n")
        return exit_code(err)
    except KeyboardInterrupt as err:  # SIGINT, or SIGTERM during a run (raysoft.interrupts)
        signum = getattr(err, "signum", signal.SIGINT)
        sys.stderr.write(f"raysoft: {error_line(err) if str(err) else 'interrupted'}\n")
        return 128 + int(signum)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
