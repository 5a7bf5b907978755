"""raysoft bench --device cuda: nvidia-smi's lines, a row's GPU columns, the floor's arithmetic,
and (marked gpu) the GPU's matrix rate, the sampler and the bare loop on a real GPU."""

import math
import stat
import time

import pytest
import torch

from raysoft.bench import gpu
from raysoft.bench.floor import floor_seconds
from raysoft.bench.gpu import GpuSampler, gpu_index, gpu_summary, parse_smi_line

NAN = float("nan")


def _same(a, b):
    return all((math.isnan(x) and math.isnan(y)) or x == y for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize(
    "line, want",
    [
        ("37, 1234", (37.0, 1234.0)),
        (" 0, 0\n", (0.0, 0.0)),
        ("100, 81559", (100.0, 81559.0)),
        ("[N/A], 512", (NAN, 512.0)),
        ("12, [Not Supported]", (12.0, NAN)),
    ],
)
def test_a_sample_line_is_utilisation_and_memory(line, want):
    assert _same(parse_smi_line(line), want)


@pytest.mark.parametrize(
    "line",
    ["", "\n", "utilization.gpu [%], memory.used [MiB]", "1, 2, 3", "42",
     "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."],
)
def test_what_is_no_sample_is_skipped(line):
    assert parse_smi_line(line) is None


def test_the_gpu_index_is_the_first_visible_device(monkeypatch):
    assert gpu_index("2,3") == "2"
    assert gpu_index("GPU-8f3e") == "GPU-8f3e"  # a UUID: nvidia-smi -i takes it too
    assert gpu_index("") == "0"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu_index() == "0"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert gpu_index() == "1"


def test_a_rows_gpu_columns_come_from_its_samples():
    samples = [(10.0, 0.0, 1000.0), (11.0, 40.0, 3000.0), (12.0, 80.0, 5000.0), (13.0, 60.0, 4000.0),
               (14.0, 5.0, 7000.0)]
    # the timed rounds: 11..13; memory: the peak of all samples less what was in use before
    assert gpu_summary(samples, 1000.0, (11.0, 13.0)) == {"gpu_util_pct": 60.0, "gpu_util_max_pct": 80.0,
                                                          "peak_gpu_mb": 6000.0}
    # no window (a floor row), or one no sample fell in (rounds shorter than the interval): all
    assert gpu_summary(samples, 1000.0)["gpu_util_pct"] == 37.0
    assert gpu_summary(samples, 1000.0, (20.0, 21.0))["gpu_util_pct"] == 37.0
    # utilisation not reported: NaN, memory still counted; an unknown baseline counts as 0
    blind = gpu_summary([(1.0, NAN, 300.0), (2.0, NAN, 900.0)], NAN)
    assert math.isnan(blind["gpu_util_pct"]) and math.isnan(blind["gpu_util_max_pct"])
    assert blind["peak_gpu_mb"] == 900.0
    # memory freed below the baseline (another process let go): 0, never negative
    assert gpu_summary([(1.0, 0.0, 100.0)], 500.0)["peak_gpu_mb"] == 0.0
    assert all(math.isnan(v) for v in gpu_summary([], 0.0).values())


def test_the_sampler_reads_nvidia_smi_in_the_background(tmp_path):
    """A stand-in nvidia-smi (the same output format) feeds the sampler's thread."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\necho "3, 100"\nsleep 0.3\necho "[N/A], 400"\necho "junk"\necho "90, 250"\n'
                   "exec sleep 30\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    began = time.monotonic()
    with GpuSampler(interval=0.1, smi=str(smi)) as sampler:
        assert sampler.available and sampler.baseline_mb == 100.0  # the first sample, waited for
        deadline = time.monotonic() + 10
        while len(sampler.samples) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert time.monotonic() - began < 8  # leaving ended the stand-in at once
    assert [s[1:] for s in sampler.samples][::2] == [(3.0, 100.0), (90.0, 250.0)]
    assert sampler.summary()["peak_gpu_mb"] == 300.0 and sampler.summary()["gpu_util_max_pct"] == 90.0


def test_without_nvidia_smi_the_sampler_samples_nothing(monkeypatch):
    monkeypatch.setattr(gpu.shutil, "which", lambda name: None)
    with GpuSampler() as sampler:
        pass
    assert not sampler.available and sampler.samples == []
    assert all(math.isnan(v) for v in sampler.summary().values())


def test_a_floor_is_the_rounds_flop_at_the_rate():
    # 1,000 and 2,500 samples of 2 MFLOP at 100 GFLOP/s: 20 ms and 50 ms
    assert floor_seconds([1000, 2500], 2e6, 100.0) == pytest.approx([0.02, 0.05])
    # the same work at an H200-like 50 TFLOP/s: 500 times less
    assert floor_seconds([1000], 2e6, 50_000.0) == pytest.approx([4e-5])
    with pytest.raises(ValueError, match="above 0"):
        floor_seconds([1000], 2e6, 0.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_gpus_fp32_matrix_rate_is_measured():
    rate = gpu.cuda_matrix_rate(samples=3)
    assert rate > 1000.0  # any CUDA GPU the bench is meant for does well over a TFLOP/s in fp32
    assert torch.backends.cuda.matmul.allow_tf32 is False  # the measurement put it back


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_sampler_sees_the_gpu():
    with GpuSampler(interval=0.1) as sampler:
        x = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")  # 256 MiB
        torch.cuda.synchronize()
        time.sleep(1.0)
        del x
    assert sampler.available and len(sampler.samples) >= 3
    assert sampler.summary()["peak_gpu_mb"] >= 200


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_bare_loop_on_the_gpu_follows_the_cpus(tmp_path, monkeypatch):
    """W2's bare FedAvg (quick size, 2 rounds) with its models and data on the GPU: the same
    maths as on the CPU (cuDNN's kernels, TF32 convolutions included, move the last digits)."""
    from support.images import write_learnable_fmnist

    from raysoft.bench.bare import bare_fedavg
    from raysoft.bench.workloads import workload_config

    write_learnable_fmnist(tmp_path / "fmnist")
    monkeypatch.setenv("RAYSOFT_DATA", str(tmp_path / "fmnist"))
    raw = workload_config("W2", 2, quick=True)
    cpu, cuda = bare_fedavg(raw), bare_fedavg(raw, device="cuda")
    assert cuda["updates"] == cpu["updates"] and len(cuda["sec_per_round_all"]) == 2
    assert cuda["test_loss"] == pytest.approx(cpu["test_loss"], rel=1e-2)
    assert cuda["timed_window"][1] > cuda["timed_window"][0]


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bench_on_the_gpu(tmp_path):
    """``raysoft bench --device cuda`` at W2's quick size: raysoft on actors of 0.25 GPU, the bare
    loop and the floor on the GPU, each row with the GPU's columns."""
    import os
    import subprocess
    import sys

    import pandas as pd
    from support.images import write_learnable_fmnist
    from support.paths import ROOT

    out = tmp_path / "bench"
    write_learnable_fmnist(tmp_path / "fmnist")
    env = {**os.environ, "RAYSOFT_DATA": str(tmp_path / "fmnist")}
    proc = subprocess.run([sys.executable, "-m", "raysoft", "bench", "--device", "cuda", "--gpu-share", "0.25",
                           "--workload", "W2", "--quick", "--rounds", "2", "--flower", "skip", "--pfl", "skip",
                           "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = pd.read_parquet(out / "bench.parquet").set_index("system")
    assert list(table.index) == ["raysoft", "bare", "floor"] and (table["device"] == "cuda").all()
    assert "(cuda fp32)" in table.loc["floor", "quality_metric"]
    assert table.loc["floor", "sec_per_round"] < table.loc["bare", "sec_per_round"]
    if gpu.shutil.which("nvidia-smi"):
        assert (table.loc[["raysoft", "bare"], "peak_gpu_mb"] > 0).all()
    assert "peak GPU memory (MB)" in (out / "bench.md").read_text()
