"""The simulated clock of synchronous rounds: per-client speeds, durations and a deadline.

With ``clock.speeds`` other than ``off``, every client has a speed (``equal``: 1; ``lognormal``:
exp(N(0, sigma²)), drawn from the run seed; ``file``: a CSV of ``client,speed``), and the
training a client does in a round takes

    duration = samples × train.local_epochs × clock.seconds_per_sample / speed × slowdown × noise

simulated seconds (``slowdown``: an injected ``slow_client`` fault's factor; ``noise``:
exp(N(0, jitter²)), drawn afresh for each round and client from the run seed, 1 without
``clock.jitter``). A round's
training calls leave out the clients whose duration exceeds ``clock.round_deadline_s``: they
take no part in the round (their update is not used and their state stays as it was), as if
they had not been sampled, and each one is an event. The round then lasts until its deadline
(until its slowest client when all are on time), and every metric row carries the simulated
time it was measured at (``virtual_time``). All of it is a pure function of the config, the
seed and the round: the same clients miss the same rounds on every backend and packing.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence

import numpy as np

from ..config import ClockConfig, Fault
from ..errors import DataFileError, MissingDataError
from ..rng import numpy_rng
from .faults import slowdown


def client_speeds(clock: ClockConfig, num_clients: int, seed: int) -> np.ndarray:
    """Each client's speed (work per simulated second, relative to 1)."""
    if clock.speeds == "lognormal":
        return np.exp(numpy_rng(seed, "clock", "speeds").normal(0.0, clock.sigma, size=num_clients))
    if clock.speeds == "file":
        assert clock.speeds_file is not None  # the config requires it
        return read_speeds(clock.speeds_file, num_clients)
    return np.ones(num_clients)


def read_speeds(path: str, num_clients: int) -> np.ndarray:
    """The speeds of a CSV file with a header ``client,speed`` and one row per client 0..N-1."""
    where = f"clock.speeds_file {path!r}"
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except FileNotFoundError:
        raise MissingDataError(f"{where}: no such file") from None
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise DataFileError(f"{where}: cannot be read as CSV ({err})") from None
    if not rows or not {"client", "speed"} <= set(rows[0]):
        raise DataFileError(f"{where}: needs a header with the columns client,speed")
    speeds = np.full(num_clients, np.nan)
    for i, row in enumerate(rows, start=2):
        try:
            k, v = int(row["client"]), float(row["speed"])
        except (TypeError, ValueError):
            raise DataFileError(f"{where}: line {i}: client must be an integer and speed a number") from None
        if not 0 <= k < num_clients:
            raise DataFileError(f"{where}: line {i}: client {k} does not exist (data.clients is {num_clients})")
        if not np.isfinite(v) or v <= 0:
            raise DataFileError(f"{where}: line {i}: speed must be a positive number (got {row['speed']!r})")
        if not np.isnan(speeds[k]):
            raise DataFileError(f"{where}: line {i}: client {k} is listed twice")
        speeds[k] = v
    missing = np.flatnonzero(np.isnan(speeds))
    if missing.size:
        raise DataFileError(f"{where}: no speed for client {int(missing[0])} ({missing.size} clients missing)")
    return speeds


class RoundClock:
    """The simulated time of a run of synchronous rounds, and who meets a round's deadline."""

    def __init__(self, clock: ClockConfig, sizes: Sequence[int] | np.ndarray, local_epochs: int,
                 faults: Sequence[Fault], seed: int) -> None:
        self.clock = clock
        self.sizes = np.asarray(sizes, dtype=np.float64)
        self.epochs = local_epochs
        self.faults = list(faults)
        self.seed = seed
        self.speeds = client_speeds(clock, len(self.sizes), seed)
        self.now = 0.0  # simulated seconds at the start of the current round
        self.longest = 0.0  # the current round's duration so far

    def duration(self, client: int, t: int) -> float:
        """Simulated seconds client ``client``'s training of round ``t`` takes."""
        work = self.sizes[client] * self.epochs * self.clock.seconds_per_sample
        noise = 1.0
        if self.clock.jitter > 0:
            noise = float(np.exp(numpy_rng(self.seed, "clock", "jitter", t, client).normal(0.0, self.clock.jitter)))
        return float(work / self.speeds[client] * slowdown(self.faults, client, t) * noise)

    def split(self, clients: Sequence[int], t: int) -> tuple[list[int], dict[int, float]]:
        """(the clients that finish within the deadline, {late client: its duration}); the round
        lasts until its deadline once a client is late, else until its slowest client."""
        on_time, late = [], {}
        deadline = self.clock.round_deadline_s
        for k in clients:
            d = self.duration(int(k), t)
            if deadline is not None and d > deadline:
                late[int(k)] = d
            else:
                on_time.append(k)
                self.longest = max(self.longest, d)
        if late:
            assert deadline is not None
            self.longest = max(self.longest, deadline)
        return on_time, late

    def end_round(self) -> None:
        """Move the clock past the round just run."""
        self.now += self.longest
        self.longest = 0.0
