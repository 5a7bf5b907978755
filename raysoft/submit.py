"""Submit a raysoft experiment as a Ray Job, follow its logs, exit with the job's outcome.

    raysoft submit --address http://127.0.0.1:8265 -- raysoft run jobs/fedsoft_synthetic.yaml
    .venv/bin/python jobs/submit.py --address http://127.0.0.1:8265 -- raysoft run jobs/fedsoft_synthetic.yaml
    raysoft run jobs/fedsoft_synthetic.yaml --address http://127.0.0.1:8265      (the same, via the CLI)

The working directory (this repository) is uploaded with ``jobs/runtime_env.yaml``. Token
authentication: the client reads the token like the ``ray`` CLI does (``RAY_AUTH_TOKEN``,
``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``). Exit code 0 if the job SUCCEEDED, 1 otherwise,
2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from pathlib import Path

import yaml

ROOT = Path.cwd()  # the working directory that is uploaded (the repository, when run from it)


# never uploaded with the working directory: run output, logs (a log being written while Ray
# packs the directory changes its hash between two reads, and the job's runtime environment
# fails to set up), virtual environments and caches
EXCLUDES = ["runs/", "*.log", "*.partial", ".venv*/", "__pycache__/", ".pytest_cache/", ".hypothesis/", ".git/"]


def entrypoint_line(words: list[str]) -> str:
    """The shell line a Ray Job runs for the argument words ``words``, each word quoted where the
    shell would split or expand it (``--set 'callbacks=[{name: mlflow}]'`` stays one word)."""
    return shlex.join(words)


def submit(address: str, entrypoint: list[str], runtime_env: str | None = None, working_dir: str | None = None,
           submission_id: str | None = None, follow: bool = True, join_timeout_s: float = 30.0) -> int:
    """Submit ``entrypoint`` (argument words, as a shell passes them) to the Jobs API at
    ``address``; follow the logs; 0 if it SUCCEEDED, else 1 with one line on stderr saying why
    (the job's status message and its last log line). :class:`~raysoft.errors.JoinError` (one
    line) if the Jobs API does not answer within ``join_timeout_s``."""
    from .backends import auth
    from .backends.join import probe
    from .errors import JoinError, first_line
    from .quiet import job_lines, quiet_ray

    probe(address, join_timeout_s)
    auth.prepare(address)  # the cluster's token goes with every request, or a one-line refusal
    from ray.job_submission import JobStatus, JobSubmissionClient

    env_file = Path(runtime_env) if runtime_env else ROOT / "jobs" / "runtime_env.yaml"
    env = (yaml.safe_load(env_file.read_text()) or {}) if env_file.is_file() else {}
    env["working_dir"] = working_dir or str(ROOT)
    env["excludes"] = list(dict.fromkeys([*env.get("excludes", []), *EXCLUDES]))
    with quiet_ray():  # the working directory's packaging, one INFO line per step, unless asked
        try:
            client = JobSubmissionClient(address)
        except ConnectionError as err:
            raise JoinError(f"ray.address {address}: {first_line(err)}") from None
        job = client.submit_job(entrypoint=entrypoint_line(entrypoint), runtime_env=env, submission_id=submission_id)
    print(f"submitted {job}", file=sys.stderr)
    if not follow:
        print(job)
        return 0

    async def tail() -> None:
        async for lines in client.tail_job_logs(job):
            sys.stdout.write(job_lines(lines))  # the job's own lines, not Ray's job manager's
            sys.stdout.flush()

    with quiet_ray():  # the client's "WebSocket closed" at the end of the logs
        asyncio.run(tail())
    info = client.get_job_info(job)
    if info.status == JobStatus.SUCCEEDED:
        print(f"job {job}: {info.status}", file=sys.stderr)
        return 0
    print(failure_line(job, str(info.status), info.error_type, info.message, client.get_job_logs(job)),
          file=sys.stderr)
    return 1


def job_entrypoint(entry: list[str], address: str) -> list[str]:
    """``entry`` with the output folder a Ray Job can keep: for ``raysoft run CONFIG`` (or
    ``python -m raysoft run CONFIG``) without ``--out``, ``--out`` the config's ``output.dir``
    (after its ``--set`` overrides) made absolute, as ``raysoft run --address http://...`` does
    (:func:`raysoft.api.job_output_dir`: only for a cluster on this machine; a relative folder
    for a remote one is refused in one line before anything is submitted). Any other entrypoint
    is returned as it is."""
    import shlex

    at = next((i for i in range(len(entry) - 1) if entry[i].endswith("raysoft") and entry[i + 1] == "run"), None)
    if at is None:
        return entry
    args = entry[at + 2:]
    if any(a == "--out" or a.startswith("--out=") or a == "--resume" or a.startswith("--resume=") for a in args):
        return entry
    config, overrides = _run_arguments(args)
    if config is None:
        return entry
    from .api import job_output_dir
    from .config import load_config

    cfg = load_config(config, overrides)
    return [*entry, "--out", shlex.quote(job_output_dir(cfg.output.dir, address))]


VALUED = ("--set", "--out", "--address", "--token-file", "--progress", "--resume")
"""``raysoft run``'s options that take a value (``raysoft/cli.py``, ``raysoft/options.py``)."""


def _run_arguments(args: list[str]) -> tuple[str | None, list[str]]:
    """``raysoft run``'s CONFIG and ``--set`` overrides among ``args``."""
    config, overrides = None, []
    words = iter(args)
    for word in words:
        name, eq, value = word.partition("=")
        if name in VALUED:
            value = value if eq else next(words, "")
            if name == "--set":
                overrides.append(value)
        elif not word.startswith("-") and config is None:
            config = word
    return config, overrides


def failure_line(job: str, status: str, error_type: str | None, message: str | None, logs: str) -> str:
    """One line for a job that did not succeed: its status, Ray's error type and the first line
    of its status message (cut at 300 characters), and the last line of its logs."""
    from .errors import one_line

    head = [line.strip() for line in (message or "").splitlines() if line.strip()]
    why = one_line(head[0]) if head else ""
    if len(why) > 300:
        why = why[:297] + "..."
    last = [line.strip() for line in logs.splitlines() if line.strip()]
    parts = [f"job {job}: {status}"]
    if error_type:
        parts.append(str(error_type))
    if why:
        parts.append(why)
    text = ": ".join(parts)
    return text + (f"; its last log line: {one_line(last[-1])}" if last else "; it wrote no log")


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """``raysoft submit`` (and jobs/submit.py): submit the entrypoint after ``--`` as a Ray Job."""
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--address", default="http://127.0.0.1:8265", help="the cluster's dashboard/Jobs address")
    ap.add_argument("--runtime-env", default=None, help="default: jobs/runtime_env.yaml of the working dir")
    ap.add_argument("--working-dir", default=None, help="default: the current directory")
    ap.add_argument("--submission-id", default=None)
    ap.add_argument("--no-follow", action="store_true", help="submit and print the id only")
    ap.add_argument("--join-timeout-s", type=float, default=30.0,
                    help="seconds to wait for the Jobs API to answer before giving up (exit 2)")
    ap.add_argument("entrypoint", nargs=argparse.REMAINDER, help="-- raysoft run CONFIG ...")
    args = ap.parse_args(argv)
    entry = [a for a in args.entrypoint if a != "--"]
    if not entry:
        sys.stderr.write(f"{ap.prog}: give the entrypoint after --, e.g. -- raysoft run jobs/fedsoft_synthetic.yaml\n")
        return 2
    from .errors import RaysoftError, error_line, exit_code

    try:
        entry = job_entrypoint(entry, args.address)  # a relative output.dir made absolute, as the CLI does
        return submit(args.address, entry, args.runtime_env, args.working_dir, args.submission_id,
                      not args.no_follow, args.join_timeout_s)
    except RaysoftError as err:
        sys.stderr.write(f"submit: {err.kind}: {error_line(err)}\n")
        return exit_code(err)


if __name__ == "__main__":
    raise SystemExit(main())
