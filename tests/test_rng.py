"""raysoft.rng: a random stream is named by (seed, purpose, ids): the same name gives the same
draws whatever else was drawn before or in between, and different names give different draws."""

import zlib

import numpy as np
import pytest
import torch

from raysoft.rng import numpy_rng, seed_sequence, torch_generator


def _draws(*name, n=8):
    return numpy_rng(*name).random(n)


def test_the_name_is_the_entropy():
    """The seed and integer ids as they are, strings by their CRC-32: crc32(b"train") = 1550247075."""
    assert zlib.crc32(b"train") == 1550247075
    assert seed_sequence(5, "train", 3).entropy == [5, 1550247075, 3]
    assert seed_sequence(-1, "train").entropy == [2**63 - 1, 1550247075]  # the seed is taken mod 2**63


def test_the_same_name_gives_the_same_draws():
    assert np.array_equal(_draws(3, "shuffle", 4, 2), _draws(3, "shuffle", 4, 2))
    a, b = torch_generator(3, "center", 1), torch_generator(3, "center", 1)
    assert torch.equal(torch.rand(8, generator=a), torch.rand(8, generator=b))


def test_streams_do_not_depend_on_call_order():
    """Client 1's stream is the same whether client 0's was drawn first, last, or not at all."""
    first = [_draws(7, "shuffle", k, 0) for k in (0, 1, 2)]
    np.random.seed(123)  # the global generators play no part
    torch.manual_seed(123)
    backwards = [_draws(7, "shuffle", k, 0) for k in (2, 1, 0)][::-1]
    for a, b in zip(first, backwards):
        assert np.array_equal(a, b)
    g = numpy_rng(7, "shuffle", 1, 0)
    g.random(100)  # drawing more from one generator does not move another
    assert np.array_equal(_draws(7, "shuffle", 1, 0), first[1])


def test_torch_generators_do_not_depend_on_call_order():
    a = torch.rand(4, generator=torch_generator(0, "center", 0))
    torch.rand(100, generator=torch_generator(0, "center", 1))
    assert torch.equal(torch.rand(4, generator=torch_generator(0, "center", 0)), a)


@pytest.mark.parametrize("other", [
    (4, "shuffle", 1, 2),  # another seed
    (3, "select", 1, 2),  # another purpose
    (3, "shuffle", 2, 2),  # another client
    (3, "shuffle", 1, 3),  # another round
    (3, "shuffle", 2, 1),  # the ids swapped
    (3, "shuffle", "1", 2),  # a string id is not the integer
    (3, 1, "shuffle", 2),  # the parts in another order
])
def test_different_names_give_different_draws(other):
    ref = (3, "shuffle", 1, 2)
    assert not np.array_equal(_draws(*ref), _draws(*other))
    assert not torch.equal(torch.rand(8, generator=torch_generator(*ref)),
                           torch.rand(8, generator=torch_generator(*other)))


@pytest.mark.xfail(strict=True, reason=(
    "numpy's SeedSequence pads an entropy shorter than its pool (4 words) with zeros, so names that "
    "differ by trailing 0 ids are one stream: (seed, 'x'), (seed, 'x', 0) and (seed, 'x', 0, 0); "
    "no caller in raysoft mixes such names today"))
def test_a_trailing_zero_id_is_another_name():
    assert not np.array_equal(_draws(3, "x"), _draws(3, "x", 0))


def test_the_torch_seed_is_the_streams_first_state_word():
    """The torch seed is the stream's first 64-bit state word (mod 2**63), a pure function of the name."""
    want = int(np.random.SeedSequence([3, zlib.crc32(b"center"), 2]).generate_state(1, np.uint64)[0] % 2**63)
    assert torch_generator(3, "center", 2).initial_seed() == want


def test_negative_ids_are_rejected():
    with pytest.raises(ValueError, match="non-negative"):
        numpy_rng(0, "shuffle", -1)
    with pytest.raises(ValueError, match="non-negative"):
        torch_generator(0, "center", -2)


def test_distinct_clients_get_independent_looking_streams():
    """A coarse check that ids 0..49 do not give shifted copies of one stream: no two of their
    first draws coincide and their mean is about 1/2."""
    firsts = np.array([numpy_rng(11, "clock", m).random() for m in range(50)])
    assert len(set(firsts.tolist())) == 50
    assert abs(firsts.mean() - 0.5) < 0.15
