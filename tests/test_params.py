"""raysoft.params: flat parameter vectors (get/set/views), weighted sums in a fixed order, and the
split sums of add_terms that must equal weighted_sum bit for bit."""

import pytest
import torch
from torch import nn

from raysoft.params import add_terms, get_flat, mean, set_flat, views_like, weighted_sum


def _two_layer():
    """Linear(2 -> 3) then Linear(3 -> 1): 6 + 3 + 3 + 1 = 13 parameters, weights 0..12 in
    ``model.parameters()`` order (weight before bias, layer by layer)."""
    model = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
    with torch.no_grad():
        start = 0
        for p in model.parameters():
            p.copy_(torch.arange(start, start + p.numel(), dtype=torch.float32).view_as(p))
            start += p.numel()
    return model


def test_get_flat_is_the_parameters_in_order():
    model = _two_layer()
    vec = get_flat(model)
    assert vec.dtype == torch.float32 and vec.shape == (13,)
    assert vec.tolist() == list(range(13))
    assert vec[:6].view(3, 2).tolist() == [[0, 1], [2, 3], [4, 5]]  # the first weight, row-major


def test_get_flat_is_a_detached_copy():
    model = _two_layer()
    vec = get_flat(model)
    assert not vec.requires_grad
    vec.zero_()
    assert get_flat(model).tolist() == list(range(13))  # the model did not change
    with torch.no_grad():
        model[1].bias.fill_(-1.0)
    assert vec.tolist() == [0.0] * 13  # nor did the vector


def test_get_flat_of_a_channels_last_conv_is_in_logical_order():
    conv = nn.Conv2d(2, 3, 3)
    want = get_flat(conv)
    cl = conv.to(memory_format=torch.channels_last)
    assert not cl.weight.is_contiguous()
    assert torch.equal(get_flat(cl), want)


def test_set_flat_round_trip():
    model = _two_layer()
    vec = torch.linspace(-1, 1, 13)
    set_flat(model, vec)
    assert torch.equal(get_flat(model), vec)
    assert model[0].weight.tolist()[2] == pytest.approx(vec[4:6].tolist())
    assert model[1].bias.item() == pytest.approx(1.0)


def test_set_flat_copies_and_does_not_alias():
    """Training the model must not write into the vector it was set from (a center shared by the
    clients of a host), and changing the vector later must not change the model."""
    model = _two_layer()
    vec = torch.ones(13)
    set_flat(model, vec)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(5.0)
    assert vec.tolist() == [1.0] * 13
    vec.fill_(7.0)
    assert get_flat(model).tolist() == [5.0] * 13
    for p in model.parameters():
        assert p.data_ptr() != vec.data_ptr()


def test_set_flat_rejects_a_vector_of_the_wrong_length():
    model = _two_layer()
    with pytest.raises(ValueError, match="14 values for a model of 13 parameters"):
        set_flat(model, torch.zeros(14))
    with pytest.raises((ValueError, RuntimeError)):
        set_flat(model, torch.zeros(12))


def test_views_like_share_the_vectors_storage():
    model = _two_layer()
    vec = torch.arange(13, dtype=torch.float32)
    views = views_like(vec, model)
    assert [v.shape for v in views] == [p.shape for p in model.parameters()]
    assert views[1].tolist() == [6, 7, 8] and views[2].tolist() == [[9, 10, 11]]
    views[3].fill_(-4.0)  # the last bias is vec[12]
    assert vec[12].item() == -4.0
    vec[0] = 100.0
    assert views[0][0, 0].item() == 100.0


def test_weighted_sum_by_hand():
    vs = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, -1.0]), torch.tensor([0.5, 0.5])]
    assert weighted_sum(vs, [2.0, 1.0, -2.0]).tolist() == [4.0, 2.0]
    stacked = torch.stack(vs)  # an [m, d] tensor works as well as a list
    assert weighted_sum(stacked, [0.0, 1.0, 0.0]).tolist() == [3.0, -1.0]
    assert mean(vs).tolist() == pytest.approx([1.5, 0.5])


def test_weighted_sum_accumulates_in_the_given_order():
    """In float32, 1e8 + 1 == 1e8: the order of the additions decides the result."""
    big, one, minus = torch.tensor([1e8]), torch.tensor([1.0]), torch.tensor([-1e8])
    assert weighted_sum([big, one, minus], [1, 1, 1]).item() == 0.0
    assert weighted_sum([big, minus, one], [1, 1, 1]).item() == 1.0


def test_weighted_sum_errors():
    with pytest.raises(ValueError, match="2 vectors but 1 weights"):
        weighted_sum([torch.zeros(2), torch.zeros(2)], [1.0])
    with pytest.raises(ValueError, match="no vectors"):
        weighted_sum([], [])


def test_weighted_sum_does_not_modify_its_inputs():
    vs = [torch.tensor([1.0]), torch.tensor([2.0])]
    out = weighted_sum(vs, [3.0, 4.0])
    assert out.item() == 11.0 and vs[0].item() == 1.0 and vs[1].item() == 2.0
    out.add_(1.0)
    assert vs[0].item() == 1.0


def test_add_terms_adds_in_ascending_key_order_whatever_the_dicts_order():
    parts = {0: torch.tensor([1e8]), 1: torch.tensor([1.0]), 2: torch.tensor([-1e8])}
    terms = {2: (None, 1.0), 0: (None, 1.0), 1: (None, 1.0)}  # inserted 2, 0, 1: that order gives 1
    assert add_terms(terms, parts, None).item() == 0.0  # 0, 1, 2: (1e8 + 1) - 1e8 in float32


def test_add_terms_rows_and_whole():
    parts = {1: torch.tensor([1.0, 2.0]), 3: torch.tensor([10.0, 20.0]), 5: torch.tensor([4.0, -4.0])}
    acc = torch.zeros(3, 2)
    out = add_terms({5: (2, 0.5), 1: (0, 2.0), 3: (2, 1.0)}, parts, acc)
    assert out is acc  # in place
    assert acc.tolist() == [[2.0, 4.0], [0.0, 0.0], [12.0, 18.0]]
    whole = torch.ones(2)
    add_terms({3: (None, 0.1)}, parts, whole)
    assert whole.tolist() == pytest.approx([2.0, 3.0])


def test_add_terms_starts_from_zeros_like_the_first_part():
    parts = {4: torch.tensor([1.0, 1.0], dtype=torch.float64), 7: torch.tensor([2.0, 3.0], dtype=torch.float64)}
    out = add_terms({7: (None, 1.0), 4: (None, -1.0)}, parts, None)
    assert out.dtype == torch.float64 and out.tolist() == [1.0, 2.0]
    assert parts[4].tolist() == [1.0, 1.0]  # not accumulated into a part


def test_add_terms_without_terms():
    start = torch.tensor([5.0])
    assert add_terms({}, {}, start) is start
    with pytest.raises(ValueError, match="no terms and no start"):
        add_terms({}, {}, None)


def test_add_terms_split_over_hosts_is_weighted_sum_bit_for_bit():
    """A sum over clients 0..5 split into hosts {0, 1, 2} and {3, 4, 5}, each continuing the
    accumulator in id order, is weighted_sum over all of them."""
    g = torch.Generator().manual_seed(0)
    vs = [torch.randn(50, generator=g) * 10 ** (k % 3) for k in range(6)]
    ws = [0.1, 0.25, 0.05, 0.3, 0.2, 0.1]
    acc = add_terms({k: (None, ws[k]) for k in (2, 0, 1)}, dict(enumerate(vs)), None)
    acc = add_terms({k: (None, ws[k]) for k in (5, 3, 4)}, dict(enumerate(vs)), acc)
    assert torch.equal(acc, weighted_sum(vs, ws))
