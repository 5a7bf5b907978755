"""Submit a raysoft experiment as a Ray Job, follow its logs, exit with the job's outcome.

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
import sys
from pathlib import Path

import yaml

ROOT = Path.cwd()  # the working directory that is uploaded (the repository, when run from it)


def submit(address: str, entrypoint: list[str], runtime_env: str | None = None, working_dir: str | None = None,
           submission_id: str | None = None, follow: bool = True) -> int:
    """Submit ``entrypoint`` to the Jobs API at ``address``; follow the logs; 0 if it SUCCEEDED."""
    from .backends import auth

    auth.prepare(address)  # the cluster's token goes with every request, or a one-line refusal
    from ray.job_submission import JobStatus, JobSubmissionClient

    env_file = Path(runtime_env) if runtime_env else ROOT / "jobs" / "runtime_env.yaml"
    env = (yaml.safe_load(env_file.read_text()) or {}) if env_file.is_file() else {}
    env["working_dir"] = working_dir or str(ROOT)
    client = JobSubmissionClient(address)
    job = client.submit_job(entrypoint=" ".join(entrypoint), runtime_env=env, submission_id=submission_id)
    print(f"submitted {job}", file=sys.stderr)
    if not follow:
        print(job)
        return 0

    async def tail() -> None:
        async for lines in client.tail_job_logs(job):
            sys.stdout.write(lines)
            sys.stdout.flush()

    asyncio.run(tail())
    status = client.get_job_status(job)
    print(f"job {job}: {status}", file=sys.stderr)
    return 0 if status == JobStatus.SUCCEEDED else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--address", default="http://127.0.0.1:8265", help="the cluster's dashboard/Jobs address")
    ap.add_argument("--runtime-env", default=None, help="default: jobs/runtime_env.yaml of the working dir")
    ap.add_argument("--working-dir", default=None, help="default: the current directory")
    ap.add_argument("--submission-id", default=None)
    ap.add_argument("--no-follow", action="store_true", help="submit and print the id only")
    ap.add_argument("entrypoint", nargs=argparse.REMAINDER, help="-- raysoft run CONFIG ...")
    args = ap.parse_args(argv)
    entry = [a for a in args.entrypoint if a != "--"]
    if not entry:
        sys.stderr.write("submit: give the entrypoint after --, e.g. -- raysoft run jobs/fedsoft_synthetic.yaml\n")
        return 2
    return submit(args.address, entry, args.runtime_env, args.working_dir, args.submission_id, not args.no_follow)


if __name__ == "__main__":
    raise SystemExit(main())
