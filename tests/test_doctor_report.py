"""doctor_report / render_doctor on this machine and with a stand-in flash_mla."""
import json
import sys

import pytest
import torch

from kernels_bridge import BACKENDS, doctor_report, flashmla
from kernels_bridge.doctor import render_doctor
import tests.oracles.fake_flash_mla as fake_flash_mla


@pytest.fixture
def without_flash_mla(monkeypatch):
    flashmla.reset_probe()
    monkeypatch.setattr(flashmla, "_probe", None)
    monkeypatch.setitem(sys.modules, "flash_mla", None)
    yield
    flashmla.reset_probe()


def test_report_without_flash_mla(without_flash_mla):
    report = doctor_report()
    json.loads(json.dumps(report))
    assert report["torch"]["version"] == torch.__version__
    assert report["torch"]["cuda_available"] == torch.cuda.is_available()
    assert report["flash_mla"]["imports"] is False
    assert "import of flash_mla halted" in report["flash_mla"]["error"]
    assert report["flash_mla"]["usable"] is False and report["flash_mla"]["flavour"] is None
    assert set(report["backends"]) == set(BACKENDS)
    for choice in report["backends"].values():
        assert choice["provider"] == "reference"
        assert "flash_mla does not import" in choice["reason"]
    text = render_doctor(report)
    assert "flash_mla  does not import" in text
    for backend in BACKENDS:
        assert f"{backend}" in text and "reference: flash_mla does not import" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="describes a machine without CUDA")
def test_report_with_flash_mla_but_no_gpu(monkeypatch):
    mod = fake_flash_mla.build("sgl-use-legacy")
    monkeypatch.setitem(sys.modules, "flash_mla", mod)
    flashmla.reset_probe()
    monkeypatch.setattr(flashmla, "_probe", None)
    report = doctor_report()
    flashmla.reset_probe()
    json.dumps(report)
    assert report["device"] is None
    assert report["flash_mla"]["imports"] is True and report["flash_mla"]["version"] == "1.0.0"
    assert report["flash_mla"]["flavour"]["name"] == "sgl-use-legacy"
    assert report["flash_mla"]["flavour"]["use_legacy"] is True
    for choice in report["backends"].values():
        assert choice["provider"] == "reference"
        assert choice["reason"].startswith("CUDA is not available")
    text = render_doctor(report)
    assert "API flavour sgl-use-legacy" in text and "no CUDA device" in text


def test_report_never_raises(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("driver exploded")
    monkeypatch.setattr(flashmla, "flashmla_status", broken)
    monkeypatch.setattr(flashmla, "unusable_reasons", broken)
    monkeypatch.setattr(torch.cuda, "is_available", broken)
    report = doctor_report()
    json.dumps(report)
    assert "driver exploded" in report["flash_mla"]["probe_error"]
    assert report["flash_mla"]["imports"] is None and report["flash_mla"]["usable"] is False
    assert "driver exploded" in report["torch"]["error"]
    for choice in report["backends"].values():
        assert "driver exploded" in choice["error"]
    assert "driver exploded" in render_doctor(report)


BLOCK_TORCH = ("import sys; sys.modules['torch'] = None; {numpy}"
               "from kernels_bridge.cli import main; sys.exit(main({argv!r}))")


@pytest.mark.parametrize("numpy_missing", [False, True])
def test_doctor_without_torch_reports_and_exits_2(numpy_missing):
    """Without torch (a plain `pip install hisparse-router`) doctor still reports, exit 2 (the
    install lacks what the bridge needs), and its hint names everything needed as pip commands a
    wheel user can run: numpy too, whose absence makes torch warn at import; attend says the same."""
    import subprocess

    from tests.helpers import ROOT

    code = BLOCK_TORCH.format(numpy="sys.modules['numpy'] = None; " if numpy_missing else "",
                              argv=["doctor"])
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "torch      does not import" in proc.stdout
    assert "pip install torch==2.13.0 numpy" in proc.stdout
    assert "pip install 'hisparse-router[bridge]'" in proc.stdout and "-e '." not in proc.stdout
    assert ("numpy      does not import" in proc.stdout) is numpy_missing
    proc = subprocess.run([sys.executable, "-c", BLOCK_TORCH.format(numpy="", argv=["doctor", "--format", "json"])],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    report = json.loads(proc.stdout)
    assert proc.returncode == 2 and report["bridge"]["usable"] is False
    proc = subprocess.run([sys.executable, "-c", BLOCK_TORCH.format(numpy="", argv=["attend"])],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "pip install torch==2.13.0 numpy" in proc.stderr


def test_doctor_with_torch_exits_0_and_reports_numpy(without_flash_mla):
    report = doctor_report()
    assert report["bridge"]["usable"] is True
    assert report["numpy"]["version"] and "numpy" in render_doctor(report)
