"""Pinned digests of every algorithm's results on small fixed-seed runs.

The digests were computed before the code was reorganised into its present layout; a change
that moves code around must leave every number bit-identical. A change that means to alter the
numbers (a new default, a bug fix) updates the digest it changes and says why in its commit.

The last bits of a run depend on the CPU: torch, oneDNN and MKL pick their vector kernels
(AVX2, AVX-512, ...) by what the CPU offers, and a few rounds of training amplify the rounding
(docs/architecture.md#determinism). So the digests are pinned per kind of CPU. On a kind that
has none, each run is compared with the same config run again in another process (and the
other tests compare packings, backends and resumed runs with clean runs), so determinism is
checked on every machine; a new kind's digests are added by running this file there on a
commit whose numbers are known to be unchanged (the failure message of a pinned kind shows
the digest).
"""

from __future__ import annotations

import pytest
from support.configs import small_config, stream_config
from support.digests import STREAMS, SYNC, check_digest
from support.images import write_fmnist

import raysoft


@pytest.fixture(scope="module")
def fm_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("fm-digest")
    write_fmnist(root)
    return root


@pytest.mark.parametrize("case", sorted(SYNC))
def test_synchronous_digest(case, tmp_path):
    cfg = small_config(**SYNC[case])
    check_digest(case, raysoft.run(cfg, out=tmp_path), cfg, tmp_path / "elsewhere")


@pytest.mark.parametrize("case", sorted(STREAMS))
def test_stream_digest(case, fm_root, tmp_path):
    algo = dict(STREAMS[case])
    cfg = stream_config(fm_root, algo.pop("name", "ccfl"), **algo)
    check_digest(case, raysoft.run(cfg, out=tmp_path), cfg, tmp_path / "elsewhere")


def test_a_cpu_without_pinned_digests_compares_runs_instead_of_skipping(tmp_path, monkeypatch):
    import support.digests

    monkeypatch.setattr(support.digests, "EXPECTED_BY_CPU", {})  # a kind of CPU nobody pinned
    cfg = small_config(**SYNC["fedavg"])
    check_digest("fedavg", raysoft.run(cfg, out=tmp_path / "a"), cfg, tmp_path / "b")  # the same: passes
    other = raysoft.run(small_config(**SYNC["fedavg"], seed=4), out=tmp_path / "c")  # stands for a changed run
    with pytest.raises(AssertionError, match="fedavg: no digest pinned for .* two runs of the same config differ"):
        check_digest("fedavg", other, cfg, tmp_path / "d")
