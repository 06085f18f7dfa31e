"""check_model, the command users run on their own checkpoint: it passes on every family's test checkpoint and on
the default model, and fails (exit 1, the first differing position) where the served copy of a weight is not the
checkpoint's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specgram import check_model
from specgram.model import packed

from .tiny import FAMILY_CONFIGS, save_family, save_family_with_loras


@pytest.mark.parametrize("name", sorted(FAMILY_CONFIGS))
def test_check_model_passes_on_every_family(name, tmp_path, capsys):
    path = save_family(tmp_path / name, name, seed=3)
    code = check_model.main([str(path), "--max-seq-len", "256"])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = {line.split()[0] for line in out.splitlines()[1:]}
    assert {"load", "logits", "greedy", "exact", "guided", "speed"} <= rows, out
    assert "FAIL" not in out and "identical ids" in out and "valid:" in out


def test_check_model_fails_where_the_served_copy_of_a_weight_differs(tmp_path, capsys, monkeypatch):
    path = save_family(tmp_path / "llama", "llama", seed=3)
    real = packed._norm_weight
    g = torch.Generator().manual_seed(0)

    def off(norm, offset=0.0, read=None):  # every norm weight of the served (native) copy off, as a packing bug
        w, eps = real(norm, offset, read)
        return w + 0.5 * torch.randn(w.shape, generator=g), eps

    monkeypatch.setattr(packed, "_norm_weight", off)
    code = check_model.main([str(path), "--max-seq-len", "256"])
    out = capsys.readouterr().out
    assert code == 1, out
    failed = [line for line in out.splitlines() if " FAIL " in line]
    assert any(line.startswith("logits  target, native") for line in failed), out
    assert not any(line.startswith("logits  target, torch") for line in failed), out  # its copy is the checkpoint
    assert any(line.startswith("greedy") and "first differing position" in line for line in failed), out
    assert "what to try (logits, target, native): the PyTorch forward agrees" in out


def test_check_model_passes_on_the_default_model():
    model = Path(__file__).resolve().parents[2] / "models" / "SmolLM2-135M-Instruct"  # set-up builds it
    r = subprocess.run(
        [sys.executable, "-m", "specgram.check_model", str(model), "--max-seq-len", "512"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "logits  target, native" in r.stdout and "FAIL" not in r.stdout, r.stdout


def test_check_model_checks_a_draft_checkpoint_and_each_adapter(tmp_path, capsys):
    loras = {"a": dict(r=4, seed=5), "b": dict(r=8, seed=6, modules=["o_proj", "gate_proj"])}
    path, _, _, listing = save_family_with_loras(tmp_path, "qwen2", 3, loras)
    draft = save_family(tmp_path / "draft", "qwen2", seed=4)
    code = check_model.main([str(path), "--draft", str(draft), "--lora", str(listing), "--max-seq-len", "256"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "logits  draft, native" in out and "logits  draft, torch" in out, out
    for name in ("a", "b"):
        assert f"k=4 vs k=0 alone, adapter {name}" in out and f"batched, k=auto vs k=0 alone, adapter {name}" in out


def test_check_model_says_why_a_checkpoint_does_not_load(tmp_path, capsys):
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    assert check_model.main([str(tmp_path), "--set", "max_slots=2"]) == 2
    assert "model_type 'bert'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        check_model.main([str(tmp_path), "--set", "max_slots"])
