"""ClientHost: hosts one or many clients' data and state, in whatever process it lives in.

The Ray client actor is a thin wrapper around a ClientHost; the in-process backend uses one
ClientHost for every client (it is then the executor itself). A client's data is built here
from (data config, client id, seed), and its state (local model, optimizer, ...) stays here
across rounds: resident, or spilled to the node's disk between its calls
(``ray.client_state``, :mod:`raysoft.backends.states`).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from typing import Any

import numpy as np
import torch

from ..algorithms import ClientContext, Plan, make_algorithm
from ..algorithms.base import SERVED_OP, BatchedOp, leaves_state, served_batched, split_result
from ..config import Config
from ..data import ClientData, Federation
from ..devices import state_to_device, to_device, with_index
from ..errors import ClientFailure, plugin_call
from ..models import build_model
from ..params import Term, add_terms
from ..runtime.comm import wire_bytes
from ..runtime.executor import Held, Placement, finite
from ..runtime.faults import slowdown
from ..runtime.threads import client_threads, torch_threads
from .allocator import release_free_memory
from .states import StateStore

VISITORS_MIN = 8  # visiting clients whose data a host keeps, at least

log = logging.getLogger(__name__)


_EMPTY = ClientData(torch.zeros(0), torch.zeros(0), np.zeros(0))
CPU = torch.device("cpu")


class ClientHost:
    """Builds and runs the clients ``client_ids`` of one experiment."""

    def __init__(self, cfg: Config, client_ids: Iterable[int], device: str = "cpu") -> None:
        self.cfg = cfg
        self.device = with_index(device)
        self.algorithm = make_algorithm(cfg.algorithm)
        self.placement: list[Placement] = []  # one process: no actors to describe
        self.late: list[int] = []  # no deadline in-process
        self._dead = False
        fed = Federation(cfg.data, cfg.seed)
        self.contexts: dict[int, ClientContext] = {}
        self.states: MutableMapping[int, object] = {}
        self.kept: dict[int, torch.Tensor] = {}  # summed parts of results held for add_terms()
        self.fed = fed
        self.scratch = build_model(cfg.model, fed.info).to(self.device)  # shared: ops never keep it
        with torch_threads(client_threads(cfg)):
            self._build(client_ids)

    def _build(self, client_ids: Iterable[int]) -> None:
        ids = [int(k) for k in client_ids]
        # other hosts' clients that ran here (balanced rounds), least recently used first; at
        # most as many as the host's own clients (and VISITORS_MIN), so that visitors' data at
        # most doubles the host's
        self.visitors: OrderedDict[int, ClientContext] = OrderedDict()
        self.visitor_capacity = max(VISITORS_MIN, len(ids))
        for k in ids:
            self.contexts[k] = self._context(k)
        self.states = StateStore(self.cfg.ray.client_state, self._initial_state, ids, self.cfg.ray.state_dir,
                                 self.device)
        if self.algorithm.batched_ops and self._batched("train", [0, 1], -1) is not None:
            from ..batched import warm_up

            warm_up()

    def _context(self, k: int) -> ClientContext:
        """Client k's data and context, built from (data config, seed, k)."""
        fed = self.fed
        data = _EMPTY if self.algorithm.own_data else fed.with_test_split(k, fed.client_data(k))
        data = to_device(data, self.device)
        return ClientContext(cfg=self.cfg, client=k, data=data, info=fed.info, scratch=self.scratch, device=self.device)

    def _initial_state(self, k: int) -> object:
        """Client k's state before its first call, from (seed, client id)."""
        with torch_threads(client_threads(self.cfg)):
            return state_to_device(self.algorithm.init_client(self.contexts[k]), self.device)

    @property
    def client_ids(self) -> list[int]:
        return sorted(self.contexts)

    # the in-process stand-ins for an actor's death and restart: the host is one "actor"
    def kill(self, actor: int) -> None:
        """Fault injection: the next call fails as if this host's actor had died."""
        self._dead = True

    def recover(self) -> None:
        """Bring a killed host back: its clients are rebuilt from (seed, client id)."""
        if self._dead:
            self.reset()
            self._dead = False

    def reset(self) -> None:
        """Rebuild every client from (seed, client id): data and initial state."""
        ids = self.client_ids
        self.contexts = {}
        self._build(ids)

    def get_states(self) -> dict[int, Any]:
        """Every hosted client's state, moved to the CPU (for checkpoints)."""
        return {k: state_to_device(self.states[k], CPU) for k in self.client_ids}

    def set_states(self, states: dict[int, Any]) -> None:
        """Restore hosted clients' states (from a checkpoint)."""
        for k, st in states.items():
            if int(k) not in self.contexts:
                raise KeyError(f"client {k} is not hosted here")
            self.states[int(k)] = state_to_device(st, self.device)

    # balanced rounds: a client's op may run on another host, with its state lent there and back
    def lend(self, client_ids: Iterable[int]) -> dict[int, Any]:
        """The states of hosted clients ``client_ids``, on the CPU, for a call on another host."""
        return {int(k): state_to_device(self.states[int(k)], CPU) for k in client_ids}

    def take(self, states: dict[int, Any]) -> None:
        """Take back the updated states of the hosted clients among ``states`` (others' are skipped)."""
        self.set_states({k: st for k, st in states.items() if int(k) in self.contexts})

    def call_with_visitors(self, method: str, op: str, client_ids: Iterable[int], payload: dict[str, object], t: int,
                           lent: Iterable[dict[int, object]],
                           ) -> tuple[dict[int, object] | dict[int, Held], dict[int, object]]:
        """:meth:`call` or :meth:`call_for_reduction` (``method``) for ``client_ids``, some of
        them other hosts' clients whose states are ``lent`` (dicts from their hosts'
        :meth:`lend`). Returns the method's answer and the visitors' states after the op, on
        the CPU (none if the op leaves states unchanged), for their hosts' :meth:`take`."""
        guests: dict[int, object] = {}
        for part in lent:
            guests.update({int(k): state_to_device(st, self.device) for k, st in part.items()})
        for k in guests:
            if k in self.visitors:
                self.visitors.move_to_end(k)
            else:
                self.visitors[k] = self._context(k)
        while len(self.visitors) > max(self.visitor_capacity, len(guests)):
            self.visitors.popitem(last=False)
        own_contexts, own_states = self.contexts, self.states
        self.contexts = {**own_contexts, **{k: self.visitors[k] for k in guests}}
        self.states = visiting = _Visiting(own_states, guests)
        try:
            out = getattr(self, method)(op, client_ids, payload, t)
            changed = visiting.changed
        finally:
            self.contexts, self.states = own_contexts, own_states
        return out, {k: state_to_device(guests[k], CPU) for k in sorted(changed)}

    def call(self, op: str, client_ids: Iterable[int], payload: dict[str, object], t: int,
             on_cpu: bool = True) -> dict[int, object]:
        """Run client op ``op`` for each of ``client_ids`` (in id order); results on the CPU
        (``on_cpu`` False: where the op made them, the host's device)."""
        if self._dead:
            raise ClientFailure("the in-process client host was killed")
        try:
            with torch_threads(client_threads(self.cfg)):
                return self._call(op, client_ids, payload, t, CPU if on_cpu else self.device)
        finally:
            if self.cfg.ray.trim_memory:
                release_free_memory()

    def call_for_reduction(self, op: str, client_ids: Iterable[int], payload: dict[str, object],
                           t: int) -> dict[int, Held]:
        """Run ``op`` and keep each result's summed tensor (an ``Update``'s ``summed``, or the
        result itself) here, on the host's device, for :meth:`add_terms`. Returns {client:
        (finite, its result's named extras, on the CPU, the bytes of its whole result)}: on a GPU
        only the sum leaves the device, not every client's update (whose size ``comm.parquet``
        counts as its upload)."""
        results = self.call(op, client_ids, payload, t, on_cpu=False)
        self.kept, out = {}, {}
        for k, r in results.items():
            self.kept[k], extras = split_result(r, op)
            out[k] = (finite(r), to_device(extras, CPU), wire_bytes(r))
        return out

    def add_terms(self, terms: Mapping[int, Term | list[Term]], acc: torch.Tensor | None,
                  fresh: bool = False) -> torch.Tensor:
        """``acc`` plus this host's terms of a plan, added in client-id order (see
        ``params.add_terms``) on the host's device; drops the kept results it used. ``fresh``:
        start from zeros like ``acc`` (a run of the tree; ``acc`` is then the plan's start, which
        it leaves alone). The sum travels between hosts on the CPU (moves are exact)."""
        parts = {k: to_device(self.kept.pop(k), self.device) for k in terms}
        if acc is not None:
            acc = torch.zeros_like(acc, device=self.device) if fresh else to_device(acc, self.device)
        return to_device(add_terms(terms, parts, acc), CPU)

    def accumulate(self, plan: Plan) -> torch.Tensor:
        """The whole plan here (the in-process backend: every client is in this host), on the
        host's device, the sum back on the CPU; then drops the kept results."""
        kept, self.kept = self.kept, {}
        parts = {k: to_device(v, self.device) for k, v in kept.items()}
        return to_device(to_device(plan, self.device).apply(parts, self.cfg.ray.tree_group), CPU)

    def _batched(self, op: str, ids: list[int], t: int) -> BatchedOp | None:
        """The algorithm's batched version of ``op`` if it may run here (not for an injected
        straggler, which is slowed client by client), else None."""
        fn = self.algorithm.batched_ops.get(op)
        if fn is None or not ids or any(self._slowdown(k, t) > 1 for k in ids) or self._budget(op) is not None:
            return None
        if leaves_state(self.algorithm, op):  # scoring, not training (FedAvg's evaluate): always together
            return fn
        from ..batched import can_batch, use_batched

        why = can_batch(self.scratch)
        if why is not None and self.cfg.train.batched_clients == "on" and not getattr(self, "_said", False):
            self._said = True
            log.warning("train.batched_clients: on, but the model has %s; training clients one by one", why)
        return fn if use_batched(self.cfg.train, self.cfg.model.name, self.scratch, self.device) else None

    def _call(self, op: str, client_ids: Iterable[int], payload: dict[str, object], t: int,
              home: torch.device) -> dict[int, object]:
        """:meth:`call`, its results moved to ``home``."""
        if op == SERVED_OP:
            return self._served(client_ids, payload, t, home)
        fn = self.algorithm.client_ops[op]
        payload = to_device(payload, self.device)
        ids = sorted(int(c) for c in client_ids)
        batched = self._batched(op, ids, t)
        if batched is not None:  # all of this host's clients in one vectorised computation
            states, results = plugin_call(batched, ([self.contexts[k] for k in ids], [self.states[k] for k in ids],
                                                    payload, t), f"{self._who()} raised in client op {op!r} of "
                                                                 f"clients {ids[0]}..{ids[-1]} (batched), round {t}")
            for k, st in zip(ids, states):
                self.states[k] = st
            return {k: to_device(res, home) for k, res in zip(ids, results)}
        out: dict[int, object] = {}
        stateless = op in self.algorithm.stateless_ops
        keeps = leaves_state(self.algorithm, op)
        budget = self._budget(op)
        for k in sorted(int(c) for c in client_ids):
            began = time.perf_counter()
            state, result = plugin_call(fn, (self.contexts[k], None if stateless else self.states[k], payload, t),
                                        f"{self._who()} raised in client op {op!r} of client {k}, round {t}")
            if not keeps:
                self.states[k] = state
            slow = self._slowdown(k, t)
            if slow > 1:  # fault injection: a straggler (a wait cut just past its deadline, if it has one)
                took = time.perf_counter() - began
                wait = (slow - 1) * took
                time.sleep(wait if budget is None else min(wait, max(budget - took, 0.0) + 1e-3))
            if budget is not None and time.perf_counter() - began > budget:
                continue  # missed ray.round_deadline_s: its update is left out (the executor reports it)
            out[k] = to_device(result, home)
        return out

    def _served(self, client_ids: Iterable[int], payload: dict[str, object], t: int,
                home: torch.device) -> dict[int, object]:
        """The engine's op :data:`SERVED_OP` for these clients (:func:`served_batched`): their
        served models on their test splits; their states are read only for an algorithm's ``serve``."""
        ids = sorted(int(c) for c in client_ids)
        payload = to_device(payload, self.device)
        states = [self.states[k] for k in ids] if self.algorithm.serve is not None else None
        results = plugin_call(served_batched(self.algorithm), ([self.contexts[k] for k in ids], states, payload, t),
                              f"{self._who()} raised serving its clients' models, round {t}")
        return {k: to_device(r, home) for k, r in zip(ids, results)}

    def _budget(self, op: str) -> float | None:
        """``ray.round_deadline_s`` for the ops that train (change client states), else None: a
        client whose own op takes longer is late, whichever clients share its actor."""
        deadline = self.cfg.ray.round_deadline_s
        return None if deadline is None or leaves_state(self.algorithm, op) else deadline

    def _who(self) -> str:
        return f"algorithm {self.cfg.algorithm.name!r}"

    def _slowdown(self, client: int, t: int) -> float:
        """A ``slow_client`` fault's factor in wall-clock time (1 with ``clock:``, where the
        simulated clock carries it)."""
        return 1.0 if self.cfg.clock.on else slowdown(self.cfg.faults, client, t)


class _Visiting(MutableMapping[int, object]):
    """A host's own states plus visiting clients' (lent) states, during one visit; records
    which visitors' states the op replaced."""

    def __init__(self, own: MutableMapping[int, object], guests: dict[int, object]) -> None:
        self.own, self.guests = own, guests
        self.changed: set[int] = set()

    def __getitem__(self, k: int) -> object:
        return self.guests[k] if k in self.guests else self.own[k]

    def __setitem__(self, k: int, state: object) -> None:
        if k in self.guests:
            self.guests[k] = state
            self.changed.add(k)
        else:
            self.own[k] = state

    def __delitem__(self, k: int) -> None:
        raise TypeError("a visiting client's state cannot be deleted")

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(set(self.own) | set(self.guests)))

    def __len__(self) -> int:
        return len(set(self.own) | set(self.guests))
