"""What used to end in an internal error or a traceback ends in a clear error of the project's
own: a workload the machine cannot hold (whatever --max-memory says), torch's allocator failing
anyway, a missing PyYAML or jsonschema with a cold cache (what to install, exit 2), a kernel
call whose outputs would not fit, a bad HotBuffer budget, a NUL byte in a path."""
import os
import subprocess
import sys

import pytest
import torch

import engine
import kernels_bridge as kb
from engine.errors import ConfigError, MissingDependency, PolicyError
from engine.files.shipped import DEFAULT_POLICY
from engine.serving.records import append_records
from kernels_bridge.errors import ValidationError
from kernels_bridge.hot_buffer import HotBuffer, HotBufferError
from tests.helpers import ROOT, minimal_text, run_cli, write_policy


@pytest.mark.parametrize("limit", ["100T", "900000000000000"])
def test_attend_refuses_a_workload_the_machine_cannot_hold_whatever_the_limit(capsys, limit):
    code, out, err = run_cli(capsys, "attend", "--requests", "100000", "--context", "100000",
                             "--max-memory", limit)
    assert code == 2 and out == ""
    assert "this workload needs" in err and "no limit raises it" in err and "internal error" not in err
    assert "raise the limit" not in err


def test_attend_reports_the_allocator_failing_anyway(capsys, monkeypatch):
    import kernels_bridge.workload as workload

    def fail(*a, **k):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 140737488355328 bytes.")
    monkeypatch.setattr(workload, "run", fail)
    code, out, err = run_cli(capsys, "attend", "--steps", "1")
    assert code == 2 and "could not allocate the workload" in err and "internal error" not in err
    monkeypatch.setattr(workload, "run", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("a bug")))
    code, _, err = run_cli(capsys, "attend", "--steps", "1")
    assert code == 2 and "internal error: RuntimeError: a bug" in err  # other errors stay what they are


@pytest.mark.parametrize("module, package", [("yaml", "PyYAML"), ("jsonschema", "jsonschema")])
@pytest.mark.parametrize("argv", [["evaluate"], ["check", "--no-deep"], ["test"], ["table"]])
def test_a_missing_reader_package_says_what_to_install(tmp_path, module, package, argv):
    script = (f"import sys; sys.modules[{module!r}] = None\n"
              "from kernels_bridge.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    env = dict(os.environ, HISPARSE_NO_CACHE="1", PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert f"install it with: python -m pip install {package}" in proc.stderr
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr


def test_a_missing_package_is_an_import_error_of_the_engine_in_the_api(monkeypatch, tmp_path):
    from engine.policy import loader

    monkeypatch.setitem(sys.modules, "jsonschema", None)
    monkeypatch.setenv("HISPARSE_NO_CACHE", "1")
    from engine.files import schema

    monkeypatch.setattr(schema, "_validators", {})
    loader.clear_cache()
    with pytest.raises(MissingDependency, match="pip install jsonschema") as info:
        engine.load_policy(write_policy(tmp_path, minimal_text(), "mini/v1.yaml"))
    assert isinstance(info.value, ImportError)
    loader.clear_cache()


def test_run_backend_refuses_outputs_that_cannot_fit():
    n = 10 ** 6
    q = torch.zeros(1, 1, 128, 576, dtype=torch.bfloat16).expand(n, 1, 128, 576)  # costs nothing
    kv = torch.zeros(4, 64, 1, 656, dtype=torch.uint8)
    idx = torch.zeros(1, 1, 128, dtype=torch.int32).expand(n, 1, 128)
    with pytest.raises(ValidationError, match=r"q: 1000000 queries x 128 heads need .* of outputs") as info:
        kb.run_backend("flashmla_kv", q, kv, idx)
    assert info.value.argument == "q"
    qs = torch.zeros(1, 128, 576, dtype=torch.bfloat16).expand(n, 128, 576)
    kvs = torch.zeros(256, 1, 576, dtype=torch.bfloat16)
    idxs = torch.zeros(1, 1, 128, dtype=torch.int32).expand(n, 1, 128)
    with pytest.raises(ValidationError, match="of outputs"):
        kb.run_backend("flashmla_sparse", qs, kvs, idxs, sm_scale=0.1)


@pytest.mark.parametrize("max_bytes", [float("nan"), float("inf"), "1G", 0, -1, True, 1.5, [1]])
def test_hot_buffer_budget_must_be_a_positive_whole_number(max_bytes):
    pool = torch.zeros(2, 256, 656, dtype=torch.uint8)
    with pytest.raises(HotBufferError, match="max_bytes: expected a positive whole number of bytes") as info:
        HotBuffer(pool, 128, max_bytes=max_bytes)
    assert info.value.argument == "max_bytes"
    assert HotBuffer(pool, 128, max_bytes=10 ** 9) is not None
    with pytest.raises(HotBufferError, match="the limit is 1 B|the limit is 1 "):  # a real budget still holds
        HotBuffer(pool, 128, max_bytes=1)


@pytest.mark.parametrize("path", ["a\0b.yaml", "dir\0/v1.yaml", "/tmp/x\0"])
def test_a_nul_in_a_path_is_the_projects_error(path):
    with pytest.raises(PolicyError, match="the path holds a NUL byte"):
        engine.load_policy(path)
    with pytest.raises(PolicyError):
        engine.evaluate(path, {})
    with pytest.raises(ConfigError, match="NUL byte"):
        append_records(path, [engine.evaluate(DEFAULT_POLICY, {})])
    with pytest.raises(PolicyError):
        engine.load_policy(DEFAULT_POLICY, path)
    with pytest.raises(ConfigError, match="NUL byte"):
        from engine.sglang.config_files import read_config_file
        read_config_file(path)
