"""The ``ray`` section: the execution backend, its resources, its waits and how a round's work is
spread over the client actors."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from .section import Section


class RayConfig(Section):
    """Execution backend and resources."""

    backend: Literal["ray", "inprocess"] = "ray"
    clients_per_actor: int | Literal["auto"] = Field(
        "auto", description="clients hosted per actor; auto: one actor per CPU (or GPU share)"
    )
    num_cpus_per_actor: float = Field(1.0, gt=0.0)
    num_gpus_per_actor: float = Field(0.0, ge=0.0, le=1.0)
    num_cpus: int | None = Field(None, ge=1, description="CPUs of a local Ray started by raysoft")
    address: str | None = Field(None, description="join an existing cluster (host:port, auto, ray://, http://)")
    join_timeout_s: float = Field(
        30.0, gt=0.0, description="seconds to wait for the cluster at address (or RAY_ADDRESS) to answer before "
        "refusing the run (one line, exit 2)"
    )
    placement: Literal["spread", "pack", "none", "trial"] = Field(
        "spread", description="place client actors with a placement group (SPREAD over nodes, or PACK); none: Ray's "
        "default; trial: in the bundles reserved by the Ray Tune trial that runs the experiment (raysoft sweep)"
    )
    placement_timeout_s: float = Field(
        300.0, gt=0.0, description="seconds to wait for the client actors' resources on a cluster that may "
        "still grow (or is busy) before refusing the run; a plan the cluster can never hold is refused at once"
    )
    round_deadline_s: float | None = Field(
        None, gt=0.0, description="wall-clock seconds a client's training may take on its actor; a client that "
        "takes longer is left out of the round (its update unused, an event; results then depend on timing; "
        "clock: decides it in simulated time instead, reproducibly)"
    )
    call_timeout_s: float | None = Field(
        None, gt=0.0, description="seconds a wait on an actor that is alive but does not answer (hung) may last "
        "before the actor is killed and handled as a dead one; null: 10 x the longest such wait so far, at least "
        "300 s (3600 s before the first)"
    )
    deadline_grace_s: float = Field(
        30.0, gt=0.0, description="round_deadline_s: an actor that has not answered after round_deadline_s x its "
        "clients in the call + this grace is left behind as a whole (its clients late)"
    )
    client_state: Literal["memory", "host", "disk"] = Field(
        "memory", description="where a host keeps its clients' states between their calls: resident on its device; "
        "host: resident in its CPU memory, moved to its GPU only while a call uses them (more clients than the GPU "
        "holds); disk: as files in a scratch directory on its node, loaded only while a call uses them (bounded "
        "memory for large N)"
    )
    state_dir: str | None = Field(None, description="client_state: disk: the node-local scratch folder (default: "
                                  "the system's temporary folder)")
    balance: Literal["cost", "clients"] = Field(
        "cost", description="who trains a round's clients: cost: the client actors take runs of consecutive client "
        "ids of even cost (samples), a client trained away from its actor travelling there with its state and back; "
        "clients: each client on the actor that hosts it. The same numbers either way (off with round_deadline_s)"
    )
    reduce_in_actors: bool = Field(
        True, description="weighted sums of client updates (FedAvg, FedSoft, IFCA, FedEM) are made inside the "
        "client actors, in client-id order along the chain of actors, one tensor per actor to the "
        "coordinator; false: every update travels to the coordinator. The same numbers either way"
    )

    sum_shape: Literal["chain", "tree"] = Field(
        "chain", description="how a round's weighted sum is added up: chain: client after client, in id order "
        "(in the actors, one hop per actor); tree: runs of sum_group consecutive clients summed from zeros, "
        "then the runs' sums pairwise, then added to the start (log-depth in the actors). Either shape gives the "
        "same numbers on every backend and packing; the two shapes differ from each other in the last bits"
    )
    sum_group: int = Field(8, ge=1, description="sum_shape: tree: clients per run of the tree's first level")
    trim_memory: bool = Field(
        True, description="after each client call, the process that hosts the clients (a client actor, or the "
        "in-process run) hands the memory its C allocator holds free back to the system (glibc's "
        "malloc_trim), so that a long run's footprint stays flat; no effect where the C library has no "
        "malloc_trim. Numbers are the same either way"
    )

    @property
    def tree_group(self) -> int | None:
        """``Plan.apply``'s ``group``: the tree's run length with ``sum_shape: tree``, None for the chain."""
        return self.sum_group if self.sum_shape == "tree" else None

    @model_validator(mode="after")
    def _deadline_needs_ray(self) -> RayConfig:
        if self.round_deadline_s is not None and self.backend != "ray":
            raise ValueError("round_deadline_s needs backend: ray")
        return self

    @field_validator("clients_per_actor")
    @classmethod
    def _positive(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be a positive integer or 'auto'")
        return v
