"""FedAvg with Flower's Ray simulation: the Flower side of the seconds-per-round benchmark.

A standalone script for the Flower venv (see ``benchmarks/flower_env.py``): it imports only the
standard library, numpy, torch and flwr, never ``raysoft``.

    <flower-venv>/bin/python benchmarks/flower.py --data W2.npz --out result.json [--num-actors 2]
                                                 [--gpu-share 0.125]

The ``.npz`` holds the clients' data (``x_<k>``, ``y_<k>``, ``num_clients``), the clients of
every round (``selection`` [rounds, K]), the initial global CNN (``init_<i>`` in
``model.parameters()`` order), a test set (``x_test``, ``y_test``) and the hyperparameters
(``lr``, ``momentum``, ``batch_size``, ``local_epochs``, ``seed``, ``channels``, ``hidden``,
``classes``).

Flower API: Flower 1.42's message API (``ClientApp`` with ``@app.train()``/``@app.query()``,
``ServerApp`` with ``@app.main()`` driving a subclass of ``flwr.serverapp.strategy.FedAvg``),
run in-process by ``flwr.simulation.run_simulation`` on the Ray backend. (1.42 marks both
``run_simulation`` and the older ``start_simulation`` deprecated in favour of the ``flwr run``
CLI; ``run_simulation`` is the one that drives the current ServerApp/ClientApp API.) Before
round 1 the server sends one ``query`` message to every node to learn its partition id (Flower's
node ids are random), which also warms the actors up; that is not part of any round's time.

Timing: a round's seconds run from the start of ``configure_train`` of round r to the end of
``aggregate_train`` of round r (sending the global model to the K clients, their training in
the actor pool, collecting the replies, FedAvg). ``total_s`` is the wall clock from just before
Ray starts to the end of the final test evaluation (Ray start-up, actor start, the node
discovery, all rounds, Ray shutdown, the test evaluation). Memory is measured from outside, by
``raysoft bench``, over this process and all its descendants.

GPU: with ``--gpu-share S`` (> 0) every client asks Ray for S of the GPU
(``client_resources={"num_cpus": 1, "num_gpus": S}``, Ray started with one GPU) and trains on
it (model and the client's images moved to ``cuda``; the reply's arrays back on the CPU); the
server's FedAvg and the final test evaluation stay on the CPU, as Flower's do. ``timed_window``
in the JSON is the span (``time.monotonic()``, a clock every process of the machine shares) of
the rounds after the first, for ``raysoft bench``'s GPU sampler.

Output: a JSON file (``--out``) and its path as the last line of stdout; any failure exits 1
with a one-line error as the last line of stderr.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

# Run as a script, this file's folder (benchmarks/, modules for raysoft's interpreter, not this
# venv's) comes first on sys.path, where a module of it could shadow one flwr or Ray imports.
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    del sys.path[0]

# Before flwr (and so ray) is imported; the Ray processes inherit these. Flower's telemetry and
# Ray's usage stats would try to reach the internet. On Linux, Ray turns a node IP of
# 127.0.0.1 (``_node_ip_address`` below) into the machine's routable address and binds its
# servers to all interfaces, unless it is told it runs a one-machine cluster, as on macOS and
# Windows: with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 the node's address is 127.0.0.1 and the
# GCS, raylet and workers listen on 127.0.0.1 only.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation
from torch import nn

# --------------------------------------------------------------------------------------------
# model and data


def make_model(channels: tuple[int, int], hidden: int, classes: int) -> nn.Module:
    """conv5x5(c1)-ReLU-maxpool2, conv5x5(c2)-ReLU-maxpool2, Linear(c2*7*7, hidden)-ReLU,
    Linear(hidden, classes), for 1x28x28 inputs."""
    c1, c2 = int(channels[0]), int(channels[1])
    return nn.Sequential(
        nn.Conv2d(1, c1, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(c2 * 7 * 7, hidden), nn.ReLU(),
        nn.Linear(hidden, classes),
    )


def _scalar(data, key: str):
    if key not in data:
        raise ValueError(f"the data file has no {key!r}")
    return np.asarray(data[key]).item()


def load_spec(path: Path) -> dict:
    """Everything but the clients' data (the clients read their own from the file)."""
    with np.load(path) as data:
        spec: dict[str, Any] = {
            "num_clients": int(_scalar(data, "num_clients")),
            "lr": float(_scalar(data, "lr")),
            "momentum": float(_scalar(data, "momentum")),
            "batch_size": int(_scalar(data, "batch_size")),
            "local_epochs": int(_scalar(data, "local_epochs")),
            "seed": int(_scalar(data, "seed")),
            "hidden": int(_scalar(data, "hidden")),
            "classes": int(_scalar(data, "classes")),
        }
        for key in ("channels", "selection", "x_test", "y_test"):
            if key not in data:
                raise ValueError(f"the data file has no {key!r}")
        channels = np.asarray(data["channels"]).astype(np.int64).ravel()
        if channels.shape != (2,):
            raise ValueError(f"channels must hold 2 ints, got shape {channels.shape}")
        spec["channels"] = (int(channels[0]), int(channels[1]))
        selection = np.asarray(data["selection"]).astype(np.int64)
        if selection.ndim != 2 or selection.shape[0] < 1 or selection.shape[1] < 1:
            raise ValueError(f"selection must be [rounds, K], got shape {selection.shape}")
        if selection.min() < 0 or selection.max() >= spec["num_clients"]:
            raise ValueError(f"selection names a client outside 0..{spec['num_clients'] - 1}")
        for r, row in enumerate(selection):
            if len(set(row.tolist())) != len(row):
                raise ValueError(f"selection[{r}] names a client twice")
        spec["selection"] = selection
        for k in range(spec["num_clients"]):
            if f"x_{k}" not in data.files or f"y_{k}" not in data.files:
                raise ValueError(f"the data file has no x_{k}/y_{k}")
        inits: list[np.ndarray] = []
        while f"init_{len(inits)}" in data.files:
            inits.append(np.asarray(data[f"init_{len(inits)}"], dtype=np.float32))
        spec["init"] = inits
        spec["y_test"] = np.asarray(data["y_test"], dtype=np.int64).ravel()
        spec["x_test"] = np.asarray(data["x_test"], dtype=np.float32).reshape(len(spec["y_test"]), 1, 28, 28)
    return spec


def initial_model(spec: dict) -> nn.Module:
    model = make_model(spec["channels"], spec["hidden"], spec["classes"])
    params = list(model.parameters())
    inits = spec["init"]
    if len(inits) != len(params):
        raise ValueError(f"the data file has {len(inits)} init_<i> arrays, the model {len(params)} parameters")
    with torch.no_grad():
        for i, (p, a) in enumerate(zip(params, inits)):
            if tuple(a.shape) != tuple(p.shape):
                raise ValueError(f"init_{i} has shape {tuple(a.shape)}, the model's parameter {tuple(p.shape)}")
            p.copy_(torch.from_numpy(a))
    return model


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray, batch: int = 1000) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            pred = model(torch.from_numpy(x[i:i + batch])).argmax(1)
            correct += int((pred == torch.from_numpy(y[i:i + batch])).sum())
    return correct / max(len(x), 1)


# --------------------------------------------------------------------------------------------
# ClientApp (pickled with every message Flower hands a Ray actor: it holds no data itself)

client_app = ClientApp()


@client_app.query()
def query(msg: Message, context: Context) -> Message:
    """Tell the server which partition (client id) this node is."""
    pid = int(context.node_config["partition-id"])
    return Message(RecordDict({"metrics": MetricRecord({"partition-id": pid})}), reply_to=msg)


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    """Local SGD from the received global model; reply with the model and n_k."""
    torch.set_num_threads(1)
    cfg = msg.content["config"]
    client = int(context.node_config["partition-id"])
    with np.load(str(cfg["data"])) as data:
        y = torch.from_numpy(np.asarray(data[f"y_{client}"], dtype=np.int64).ravel())
        x = torch.from_numpy(np.asarray(data[f"x_{client}"], dtype=np.float32).reshape(len(y), 1, 28, 28))
    n = len(y)
    device = torch.device("cuda" if bool(cfg["gpu"]) and torch.cuda.is_available() else "cpu")
    x, y = x.to(device), y.to(device)
    model = make_model((int(cfg["c1"]), int(cfg["c2"])), int(cfg["hidden"]), int(cfg["classes"]))
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    model.to(device)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=float(cfg["lr"]), momentum=float(cfg["momentum"]))
    loss_fn = nn.CrossEntropyLoss()
    # 0-based round index, as in the selection array
    rng = np.random.default_rng([int(cfg["seed"]), client, int(cfg["server-round"]) - 1])
    bs = int(cfg["batch-size"])
    total, steps = 0.0, 0
    for _ in range(int(cfg["local-epochs"])):
        order = torch.from_numpy(rng.permutation(n)).to(device)
        for i in range(0, n, bs):
            idx = order[i:i + bs]
            optimizer.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            optimizer.step()
            total += float(loss.detach())
            steps += 1
    content = RecordDict({
        "arrays": ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()}),
        "metrics": MetricRecord({"num-examples": n, "train-loss": total / max(steps, 1)}),
    })
    return Message(content, reply_to=msg)


# --------------------------------------------------------------------------------------------
# ServerApp


class SelectedFedAvg(FedAvg):
    """FedAvg (weighted by n_k) over exactly the clients ``selection[r]`` in round r + 1, with
    no federated evaluation; times every round (configure_train start to aggregate_train end)."""

    def __init__(self, selection: np.ndarray, node_of: dict[int, int]) -> None:
        super().__init__(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=1)
        self.selection = selection
        self.node_of = node_of
        self.round_times: list[float] = []
        self.round_spans: list[tuple[float, float]] = []  # time.monotonic() at each round's start and end
        self._t0 = 0.0
        self._m0 = 0.0

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):
        self._t0 = time.perf_counter()
        self._m0 = time.monotonic()
        config["server-round"] = server_round
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        nodes = [self.node_of[int(c)] for c in self.selection[server_round - 1]]
        return self._construct_messages(record, nodes, MessageType.TRAIN)

    def aggregate_train(self, server_round: int, replies):
        replies = list(replies)
        errors = [m for m in replies if m.has_error()]
        if errors:
            raise RuntimeError(f"round {server_round}: a client failed: {_reason(errors[0])}")
        want = self.selection.shape[1]
        if len(replies) != want:
            raise RuntimeError(f"round {server_round}: {len(replies)} of {want} clients replied")
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is None:
            raise RuntimeError(f"round {server_round}: nothing to aggregate")
        self.round_times.append(time.perf_counter() - self._t0)
        self.round_spans.append((self._m0, time.monotonic()))
        return arrays, metrics


def _reason(msg: Message) -> str:
    """The gist of an error reply: Flower's reason holds the actor's whole traceback, whose
    last "Message: ..." is the ClientApp's exception."""
    reason = str(msg.error.reason)
    tail = reason.rsplit("Message: ", 1)[-1].strip().rstrip(">").rstrip("'").strip()
    return " ".join(tail.split())[:400]


def _wait_for_nodes(grid: Grid, n: int, timeout: float = 300.0) -> list[int]:
    """The ServerApp thread starts before the simulation registers its nodes."""
    end = time.monotonic() + timeout
    while True:
        nodes = list(grid.get_node_ids())
        if len(nodes) >= n:
            return nodes
        if time.monotonic() > end:
            raise RuntimeError(f"only {len(nodes)} of {n} simulated nodes came up in {timeout:.0f} s")
        time.sleep(0.05)


def _partition_map(grid: Grid, nodes: list[int]) -> dict[int, int]:
    """client id -> node id, asked of every node with a query message."""
    msgs = [
        Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=nid, message_type=MessageType.QUERY)
        for nid in nodes
    ]
    replies = list(grid.send_and_receive(msgs, timeout=3600))
    node_of: dict[int, int] = {}
    for m in replies:
        if m.has_error():
            raise RuntimeError(f"node discovery: a client failed: {_reason(m)}")
        node_of[int(m.content["metrics"]["partition-id"])] = int(m.metadata.src_node_id)
    if len(node_of) != len(nodes):
        raise RuntimeError(f"node discovery: {len(node_of)} of {len(nodes)} nodes answered")
    return node_of


def make_server_app(spec: dict, data_path: Path, out: dict) -> ServerApp:
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        nodes = _wait_for_nodes(grid, spec["num_clients"])
        node_of = _partition_map(grid, nodes)
        strategy = SelectedFedAvg(spec["selection"], node_of)
        train_config = ConfigRecord({
            "data": str(data_path),
            "lr": spec["lr"], "momentum": spec["momentum"],
            "batch-size": spec["batch_size"], "local-epochs": spec["local_epochs"],
            "seed": spec["seed"],
            "c1": spec["channels"][0], "c2": spec["channels"][1],
            "hidden": spec["hidden"], "classes": spec["classes"], "gpu": bool(spec.get("gpu_share", 0.0) > 0),
        })
        model = initial_model(spec)
        result = strategy.start(
            grid=grid,
            initial_arrays=ArrayRecord(model.state_dict()),
            num_rounds=int(spec["selection"].shape[0]),
            train_config=train_config,
        )
        out["arrays"] = result.arrays
        out["round_times"] = list(strategy.round_times)
        out["round_spans"] = list(strategy.round_spans)

    return app


# --------------------------------------------------------------------------------------------


def backend_config(num_actors: int, gpu_share: float = 0.0) -> dict:
    """Flower's Ray backend: Ray started here (never joined), on loopback, without a dashboard,
    with one CPU per actor so that exactly ``num_actors`` actors run at once; ``gpu_share`` > 0:
    Ray has one GPU and every client asks for that share of it."""
    return {
        "init_args": {
            "address": "local",
            "_node_ip_address": "127.0.0.1",
            "include_dashboard": False,
            "num_cpus": num_actors,
            "num_gpus": 1 if gpu_share > 0 else 0,
        },
        "client_resources": {"num_cpus": 1, "num_gpus": float(gpu_share)},
    }


def bench(data_path: Path, out_path: Path, num_actors: int, gpu_share: float = 0.0) -> dict:
    if num_actors < 1:
        raise ValueError("--num-actors must be at least 1")
    if not 0 <= gpu_share <= 1:
        raise ValueError(f"--gpu-share must lie in [0, 1] (got {gpu_share})")
    if gpu_share > 0 and not torch.cuda.is_available():
        raise RuntimeError("--gpu-share: torch finds no CUDA here")
    spec = load_spec(data_path)
    spec["gpu_share"] = gpu_share
    initial_model(spec)  # check the init arrays against the model before starting anything
    t0 = time.perf_counter()
    out: dict = {}
    backend = backend_config(num_actors, gpu_share)
    run_simulation(
        server_app=make_server_app(spec, data_path, out),
        client_app=client_app,
        num_supernodes=spec["num_clients"],
        backend_name="ray",
        backend_config=backend,
    )
    if "arrays" not in out or out["arrays"] is None:
        raise RuntimeError("the Flower simulation ended without a final global model")
    rounds, k = spec["selection"].shape
    if len(out["round_times"]) != rounds:
        raise RuntimeError(f"{len(out['round_times'])} of {rounds} rounds were timed")
    model = make_model(spec["channels"], spec["hidden"], spec["classes"])
    model.load_state_dict(out["arrays"].to_torch_state_dict())
    acc = accuracy(model, spec["x_test"], spec["y_test"])
    total = time.perf_counter() - t0
    spans = out["round_spans"]
    result = {
        "system": "flower",
        "flwr_version": importlib.metadata.version("flwr"),
        "ray_version": importlib.metadata.version("ray"),
        "sec_per_round": [float(t) for t in out["round_times"]],
        "accuracy": float(acc),
        "rounds": int(rounds),
        "clients_per_round": int(k),
        "total_s": float(total),
        "gpu_share": float(gpu_share),
        "timed_window": [spans[1][0] if len(spans) > 1 else spans[0][0], spans[-1][1]],
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, out_path)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, type=Path, help="the benchmark's .npz")
    parser.add_argument("--out", required=True, type=Path, help="where to write the result JSON")
    parser.add_argument("--num-actors", type=int, default=2, help="Ray actors (1 CPU each) training clients at once")
    parser.add_argument("--gpu-share", type=float, default=0.0,
                        help="each client's share of the GPU (client_resources num_gpus); 0: on the CPU")
    args = parser.parse_args(argv)

    def _on_sigterm(signum, frame):  # shut Ray down as on Ctrl-C rather than die at once
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        bench(args.data.resolve(), args.out.resolve(), args.num_actors, args.gpu_share)
    except BaseException as exc:  # one line on stderr for any failure
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            raise
        # Flower shuts Ray down when its simulation loop ends; should Ray still be up (it was
        # imported by flwr, so this is no import of ours), shut it down here
        ray = sys.modules.get("ray")
        try:
            if ray is not None and ray.is_initialized():
                ray.shutdown()
        except Exception:  # noqa: BLE001 - best effort
            pass
        msg = f"{type(exc).__name__}: {exc}".replace("\n", " ").strip()
        sys.stdout.flush()
        print(f"benchmarks/flower.py: error: {msg}", file=sys.stderr, flush=True)
        # not sys.exit: after an interrupt Flower's ServerApp thread (not a daemon) may still be
        # running its rounds and would keep the interpreter from exiting
        os._exit(1)
    print(args.out.resolve(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
