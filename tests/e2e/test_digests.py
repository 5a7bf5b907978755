"""Pinned digests of every algorithm's results on small fixed-seed runs.

The digests were computed before the code was reorganised into its present layout; a change
that moves code around must leave every number bit-identical. A change that means to alter the
numbers (a new default, a bug fix) updates the digest it changes and says why in its commit.

The last bits of a run depend on the CPU: torch, oneDNN and MKL pick their vector kernels
(AVX2, AVX-512, ...) by what the CPU offers, and a few rounds of training amplify the rounding
(docs/architecture.md#determinism). So the digests are pinned per kind of CPU, and on a kind
that has none the test is skipped, saying which kind it found; a new kind's digests are added
by running this file there on a commit whose numbers are known to be unchanged.
"""

from __future__ import annotations

import pytest
from support.configs import small_config, stream_config
from support.digests import STREAMS, SYNC, digest, expected
from support.images import write_fmnist

import raysoft


@pytest.fixture(scope="module")
def fm_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("fm-digest")
    write_fmnist(root)
    return root


@pytest.mark.parametrize("case", sorted(SYNC))
def test_synchronous_digest(case, tmp_path):
    want = expected(case)
    run = raysoft.run(small_config(**SYNC[case]), out=tmp_path)
    assert digest(run) == want


@pytest.mark.parametrize("case", sorted(STREAMS))
def test_stream_digest(case, fm_root, tmp_path):
    algo = dict(STREAMS[case])
    name = algo.pop("name", "ccfl")
    want = expected(case)
    run = raysoft.run(stream_config(fm_root, name, **algo), out=tmp_path)
    assert digest(run) == want
