"""ClientHost, the in-process executor, on the small synthetic config: which clients run, sums
kept where the clients are, client states, reset, kill and recover."""

import io

import numpy as np
import pytest
import torch
from support.configs import small_config

from raysoft.algorithms import WeightedMean
from raysoft.backends.host import ClientHost
from raysoft.config import parse_config
from raysoft.errors import ClientFailure

D = 10  # the linear model's parameter count on the small synthetic data


def payload(algorithm: str) -> dict:
    """A train payload of the algorithm (FedAvg: the global model; FedSoft: two centers and the
    weights u; its lambda is the config's)."""
    if algorithm == "fedavg":
        return {"model": torch.full((D,), 0.1)}
    return {"u": np.full((10, 2), 0.5), "centers": torch.stack([torch.zeros(D), torch.ones(D)])}


def host(algorithm: str = "fedavg", clients=range(10), batched: str = "off") -> ClientHost:
    cfg = parse_config(small_config(algorithm={"name": algorithm}, train={"batched_clients": batched}))
    return ClientHost(cfg, clients)


def train(h: ClientHost, clients: list[int], t: int, algorithm: str = "fedavg") -> dict:
    return h.call("train", clients, payload(algorithm), t)


def same(a: dict, b: dict) -> bool:
    """The same clients with bit-identical results."""
    def eq(x, y):  # a model, or FedSoft's Update(model, {"dist": distance to its mixture})
        if isinstance(x, torch.Tensor):
            return torch.equal(x, y)
        return torch.equal(x.summed, y.summed) and x.extras == y.extras

    return list(a) == list(b) and all(eq(a[k], b[k]) for k in a)


def checkpointed(states: dict) -> dict:
    """The states as a checkpoint holds them (saved and loaded again)."""
    buf = io.BytesIO()
    torch.save(states, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


# ---------------------------------------------------------------- calls
@pytest.mark.parametrize("batched", ["off", "on"])
def test_call_answers_exactly_the_asked_clients_in_id_order(batched):
    h = host(batched=batched)
    out = train(h, [7, 2, 5], 0)
    assert list(out) == [2, 5, 7]
    assert all(r.shape == (D,) and r.device.type == "cpu" for r in out.values())
    assert list(h.call("evaluate", [9, 0], payload("fedavg"), 0)) == [0, 9]
    # the clients not asked did not train: client 3's first training is a fresh client's
    assert same(train(h, [3], 1), train(host(batched=batched), [3], 1))


def test_the_clients_of_one_call_are_independent_of_each_other():
    together = train(host(), [1, 4], 0)
    assert same({1: train(host(), [1], 0)[1], 4: train(host(), [4], 0)[4]}, together)
    assert not torch.equal(together[1], together[4])


@pytest.mark.parametrize("batched", ["off", "on"])
def test_keep_then_accumulate_is_the_plan_applied_to_the_call_results(batched):
    ids = [6, 0, 3]
    h, ref = host(batched=batched), host(batched=batched)
    flags = h.call_for_reduction("train", ids, payload("fedavg"), 0)
    assert flags == {0: (True, {}, 4 * D), 3: (True, {}, 4 * D), 6: (True, {}, 4 * D)}  # a float32 model's bytes
    results = train(ref, ids, 0)
    sizes = h.fed.sizes
    plan = WeightedMean(sizes).plan({k: {} for k in flags})
    assert plan.terms == {k: (None, sizes[k] / (sizes[0] + sizes[3] + sizes[6])) for k in (0, 3, 6)}
    value = h.accumulate(plan)
    assert torch.equal(value, plan.apply(results))  # the coordinator's sum of the same results
    by_hand = sum(float(sizes[k]) * results[k].double() for k in (0, 3, 6)) / float(sizes[[0, 3, 6]].sum())
    assert torch.allclose(value.double(), by_hand, rtol=1e-6, atol=1e-7)
    with pytest.raises(KeyError):  # accumulate dropped what was kept
        h.accumulate(plan)


def test_add_terms_adds_this_host_s_terms_to_the_partial_sum_it_receives():
    h = host(clients=[2, 5])
    h.call_for_reduction("train", [2, 5], payload("fedavg"), 0)
    r = train(host(), [2, 5], 0)
    start = torch.ones(D)
    acc = h.add_terms({2: (None, 0.5), 5: (None, -2.0)}, start)
    assert acc is start  # added in place
    assert torch.equal(acc, torch.ones(D).add_(r[2], alpha=0.5).add_(r[5], alpha=-2.0))
    with pytest.raises(KeyError):
        h.add_terms({2: (None, 1.0)}, None)


def test_keep_reports_non_finite_results():
    h = host()
    flags = h.call_for_reduction("train", [1, 2], {"model": torch.full((D,), float("nan"))}, 0)
    assert flags == {1: (False, {}, 4 * D), 2: (False, {}, 4 * D)}


# ---------------------------------------------------------------- client states
@pytest.mark.parametrize("algorithm", ["fedavg", "fedsoft"])
def test_states_saved_and_restored_give_the_same_next_result(algorithm):
    h = host(algorithm)
    train(h, [0, 1], 0, algorithm)
    saved = checkpointed(h.get_states())
    assert sorted(saved) == list(range(10))
    next_result = train(h, [0, 1], 1, algorithm)
    train(h, [0, 1], 2, algorithm)  # the states move on
    h.set_states(saved)
    assert same(train(h, [0, 1], 1, algorithm), next_result)
    # the state matters: a fresh client's result of round 1 is another one
    fresh = train(host(algorithm), [0, 1], 1, algorithm)
    assert not same({0: fresh[0]}, {0: next_result[0]})


def _optimizers(obj, found=None) -> list:
    """The optimizers in a client state (FedAvg's is one, FedEM's a list, FedSoft's a field)."""
    from raysoft.optim import SGD, Adam

    found = [] if found is None else found
    if isinstance(obj, (Adam, SGD)):
        found.append(obj)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _optimizers(v, found)
    elif hasattr(obj, "__dict__") and not isinstance(obj, torch.nn.Module):
        for v in vars(obj).values():
            _optimizers(v, found)
    return found


@pytest.mark.parametrize(("algorithm", "optimizer"), [("fedavg", "sgd"), ("fedavg", "adam"), ("fedem", "adam"),
                                                      ("fedsoft", "sgd")])
def test_a_checkpoint_s_client_states_hold_no_scratch_model(algorithm, optimizer):
    """A checkpoint's client states (``get_states``, saved and read back as ``--resume`` reads
    them) hold their own tensors only: optimizer moments (and FedSoft's own model), never the
    host's scratch model their optimizers train, so their size is the same whatever device they
    were on (the live state moved to ``meta``, another device, holds the same bytes); read back,
    the optimizers are unbound and the next round's results are those of the uninterrupted run."""
    from raysoft.devices import state_to_device, tensors_in
    from raysoft.runtime.checkpoint import checkpoint_types

    cfg = parse_config(small_config(algorithm={"name": algorithm},
                                    train={"optimizer": optimizer, "momentum": 0.9, "batched_clients": "off"}))
    h = ClientHost(cfg, range(10))
    if algorithm == "fedem":  # its learners, one per optimizer of a client
        m = len(h.states[0].optimizers)
        pay = {"learners": torch.stack([torch.full((D,), 0.1 * (i + 1)) for i in range(m)])}
    else:
        pay = payload(algorithm)
    h.call("train", list(range(10)), pay, 0)
    live = h.get_states()
    buf = io.BytesIO()
    torch.save(live, buf)
    buf.seek(0)
    with torch.serialization.safe_globals(checkpoint_types()):
        saved = torch.load(buf, weights_only=True)
    scratch = {p.data_ptr() for p in h.scratch.parameters()}
    d = sum(p.numel() for p in h.scratch.parameters())
    per_moment = {"sgd": 1, "adam": 2}[optimizer]
    for k, st in saved.items():
        opts = _optimizers(st)
        assert opts and all(o.params == [] for o in opts)
        assert sum(t.numel() for o in opts for t in tensors_in(o)) == per_moment * d * len(opts), k
        own = {"fedavg": 0, "fedem": len(opts), "fedsoft": d}[algorithm]  # FedEM's pi, FedSoft's own model
        tensors = tensors_in(st)
        assert sum(t.numel() for t in tensors) == per_moment * d * len(opts) + own, k
        assert not {t.data_ptr() for t in tensors_in(live[k])} & scratch  # the live one: no scratch either
        on_meta = state_to_device(live[k], torch.device("meta"))
        assert sum(t.nbytes for t in tensors_in(on_meta)) == sum(t.nbytes for t in tensors), k
    next_result = h.call("train", [0, 1], pay, 1)
    h.set_states(saved)
    again = h.call("train", [0, 1], pay, 1)
    assert list(again) == [0, 1] and all(torch.equal(torch.as_tensor(getattr(a, "summed", a)),
                                                     torch.as_tensor(getattr(b, "summed", b)))
                                         for a, b in zip(again.values(), next_result.values()))


def test_reset_rebuilds_the_initial_states():
    h = host()
    first = train(h, [0, 4, 9], 0)
    train(h, [0, 4, 9], 1)
    h.reset()
    assert same(train(h, [0, 4, 9], 0), first)
    assert same(first, train(host(), [0, 4, 9], 0))


def test_a_host_of_some_clients_knows_only_them():
    h = host(clients=[8, 3])
    assert h.client_ids == [3, 8] and sorted(h.get_states()) == [3, 8]
    with pytest.raises(KeyError, match="client 5 is not hosted here"):
        h.set_states({5: h.get_states()[3]})


# ---------------------------------------------------------------- kill and recover
def test_a_killed_host_fails_until_recovered_with_rebuilt_clients():
    h = host()
    train(h, [0, 1], 0)  # trained: the state is no longer the initial one
    h.kill(0)
    with pytest.raises(ClientFailure):
        train(h, [0, 1], 1)
    with pytest.raises(ClientFailure):
        h.call_for_reduction("train", [0, 1], payload("fedavg"), 1)
    h.recover()
    assert same(train(h, [0, 1], 0), train(host(), [0, 1], 0))


def test_recover_leaves_a_live_host_as_it_is():
    h, ref = host(), host()
    for x in (h, ref):
        train(x, [0, 1], 0)
    h.recover()
    assert same(train(h, [0, 1], 1), train(ref, [0, 1], 1))


@pytest.mark.parametrize("algorithm, state_mode", [("fedsoft", "memory"), ("fedsoft", "disk"), ("fedavg", "memory")])
def test_a_visiting_client_trains_as_it_would_at_home(algorithm, state_mode, tmp_path):
    """Balanced rounds: clients 3 and 4 of host A train on host B with their lent states; the
    results, and the states A takes back, are those of training them at home, two rounds on."""
    def make(clients):
        cfg = parse_config(small_config(algorithm={"name": algorithm},
                                        ray={"client_state": state_mode, "state_dir": str(tmp_path)}))
        return ClientHost(cfg, clients)

    home, a, b = make(range(10)), make(range(5)), make(range(5, 10))
    for t in (0, 1):
        want = train(home, [3, 4, 6], t, algorithm)
        got_b, back = b.call_with_visitors("call", "train", [3, 4, 6], payload(algorithm), t, [a.lend([3, 4])])
        assert sorted(back) == [3, 4]  # only the visitors' states travel back
        a.take(back)
        assert same(got_b, want)
        assert 3 not in b.contexts and 3 not in list(b.states)  # B hosts its own clients only
    assert same(train(a, [3, 4], 2, algorithm), train(home, [3, 4], 2, algorithm))


def test_the_visitor_cache_keeps_the_most_recent_visitors():
    """A host keeps the data of at most max(VISITORS_MIN, its own clients) visiting clients,
    dropping the least recently used; a dropped visitor is rebuilt from (seed, id) alike."""
    from raysoft.backends.host import VISITORS_MIN

    a, b = host("fedsoft", range(9)), host("fedsoft", range(9, 10))  # the small config has 10 clients
    centers = {"centers": torch.stack([torch.zeros(D), torch.ones(D)])}
    first, _ = b.call_with_visitors("call", "evaluate", [0], centers, 0, [a.lend([0])])
    for k in range(1, 9):
        b.call_with_visitors("call", "evaluate", [k], centers, 0, [a.lend([k])])
    assert list(b.visitors) == list(range(9 - VISITORS_MIN, 9))
    b.call_with_visitors("call", "evaluate", [5], centers, 0, [a.lend([5])])  # a hit moves to the end
    assert list(b.visitors)[-1] == 5 and len(b.visitors) == VISITORS_MIN
    again, _ = b.call_with_visitors("call", "evaluate", [0], centers, 0, [a.lend([0])])  # dropped, rebuilt
    assert again == first and 0 in b.visitors


def test_a_visit_that_leaves_states_unchanged_sends_none_back():
    a, b = host("fedsoft", range(5)), host("fedsoft", range(5, 10))
    state_before = a.lend([2])
    centers = {"centers": torch.stack([torch.zeros(D), torch.ones(D)])}
    out, back = b.call_with_visitors("call", "evaluate", [2, 7], centers, 0, [state_before])
    assert back == {} and sorted(out) == [2, 7]
