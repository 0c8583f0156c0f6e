"""Smoke tests of the bench CLI and the training example (tiny sizes, CPU)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_bench_cli(tmp_path):
    cmd = [sys.executable, "-m", "flashattn.bench", "--device", "cpu", "--seqlens", "32", "64", "--heads", "1",
           "--head-dim", "32", "--warmup", "1", "--repeats", "1", "--mode", "fwd_bwd", "--causal",
           "--backends", "flashattn", "sdpa-flash", "sdpa-efficient", "sdpa-math",
           "--json", str(tmp_path / "bench.json"), "--plot-dir", str(tmp_path)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr
    assert "[1/8] flashattn seqlen=32" in res.stderr  # progress while it runs
    assert "backend" in res.stdout and "TFLOP/s" in res.stdout  # the table
    data = json.loads((tmp_path / "bench.json").read_text())
    rows = {(r["backend"], r["seqlen"]): r for r in data["results"]}
    assert rows[("flashattn", 64)]["status"] == "ok" and rows[("flashattn", 64)]["tflops"] > 0
    assert rows[("sdpa-math", 64)]["status"] == "ok"
    pytest.importorskip("matplotlib", reason="matplotlib is not installed: no plots to check")
    assert (tmp_path / "tflops.png").stat().st_size > 1000


def test_train_gpt_example(tmp_path):
    cmd = [sys.executable, str(ROOT / "examples" / "train_gpt.py"), "--attn", "flashattn", "sdpa", "math",
           "--steps", "3", "--log-every", "1", "--context", "32", "--layers", "1", "--dim", "32", "--heads", "2",
           "--batch", "2", "--device", "cpu", "--json", str(tmp_path / "run.json")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr
    assert "[flashattn] final loss" in res.stdout and "peak memory" in res.stdout
    runs = json.loads((tmp_path / "run.json").read_text())["results"]
    losses = {r["attn"]: r["losses"] for r in runs}
    # Same weights, same batches: the three attentions give the same loss curve (fp32).
    for kind in ("sdpa", "math"):
        assert max(abs(a - b) for a, b in zip(losses["flashattn"], losses[kind])) < 1e-4
