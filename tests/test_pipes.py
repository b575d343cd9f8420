"""Exit codes survive pipes: a command whose stdout reader went away (`| true`, `| head -1`)
still exits with its verdict (1 for a rejected config, a failing test, a difference; 2 for an
error; 0 only when the answer is 0), never 0 because the reader left; a stdout that cannot be
written (/dev/full) is one error line and exit 2, `--help` included."""
import io
import json
import os
import subprocess
import sys

import pytest

from engine.files.shipped import DEFAULT_POLICY
from tests.helpers import ROOT, main, minimal_text, write_policy

OLD, NEW = f"{DEFAULT_POLICY}@1", f"{DEFAULT_POLICY}@2"  # two versions that differ

FAILING_CASES = """
cases:
  - name: a wrong expectation
    config: {kv_cache_dtype: bfloat16, decode_backend: flashmla_kv}
    expect:
      ok: true
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pipes")
    write_policy(tmp, minimal_text(), "mini/v1.yaml")
    tests = write_policy(tmp, FAILING_CASES, "mini/tests/v1.yaml")
    bad_policy = write_policy(tmp, "policy: x\nversion: [\n", "bad.yaml")
    records = tmp / "records.jsonl"
    code = main(["evaluate", "--enable-hisparse", "--kv-cache-dtype", "fp8_e4m3", "--disable-radix-cache",
                 "--record", str(records),
                 "--format", "json"])
    assert code == 0
    batch = tmp / "batch.jsonl"
    batch.write_text('{}\n' * 3 + '{"enable_hisparse": true, "kv_cache_dtype": "bfloat16", '
                     '"dsa_decode_backend": "flashmla_kv"}\n' + '{}\n' * 5000)
    return {"tests": tests, "bad": bad_policy, "records": str(records), "batch": str(batch)}


def _cases(f):
    """(name, argv, the verdict's exit code)."""
    rejected = ["--enable-hisparse", "--kv-cache-dtype", "bfloat16", "--dsa-decode-backend", "flashmla_kv"]
    return [
        ("evaluate rejected", ["evaluate", *rejected], 1),
        ("evaluate rejected json", ["evaluate", *rejected, "--format", "json"], 1),
        ("evaluate accepted", ["evaluate"], 0),
        ("evaluate bad input", ["evaluate", "--config", "/nonexistent/c.yaml"], 2),
        ("batch with a rejected line past the reader", ["evaluate", "--batch", f["batch"]], 1),
        ("explain rejected", ["explain", *rejected], 1),
        ("check invalid policy", ["check", f["bad"]], 2),
        ("check ok", ["check", "--no-deep"], 0),
        ("diff different", ["diff", OLD, NEW], 1),
        ("diff markdown", ["diff", OLD, NEW, "--format", "markdown"], 1),
        ("diff equivalent", ["diff", NEW, NEW], 0),
        ("table", ["table", "--format", "json"], 0),
        ("test failing", ["test", f["tests"]], 1),
        ("test json failing", ["test", f["tests"], "--format", "json"], 1),
        ("replay different", ["replay", f["records"], "--policy", OLD], 1),
        ("attend rejected", ["attend", *rejected], 1),
        ("help", ["--help"], 0),
        ("command help", ["diff", "--help"], 0),
        ("usage", [], 2),
        ("version", ["--version"], 0),
    ]


def _run(argv, stdout):
    return subprocess.run([sys.executable, "-m", "kernels_bridge.cli", *argv], stdout=stdout,
                          stderr=subprocess.PIPE, cwd=ROOT, timeout=300, text=True)


def test_every_command_keeps_its_verdict_when_the_reader_has_left(files):
    """The read end is closed before the command starts, so its first write fails with EPIPE:
    the exit code is the verdict, there is no traceback, and stderr holds no write error."""
    for name, argv, verdict in _cases(files):
        read, write = os.pipe()
        os.close(read)
        try:
            proc = _run(argv, write)
        finally:
            os.close(write)
        assert proc.returncode == verdict, (name, proc.stderr)
        assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, name
        assert "cannot write" not in proc.stderr and "internal error" not in proc.stderr, name


def test_a_reader_that_leaves_after_the_first_line_does_not_turn_a_difference_into_0():
    """`hisparse diff A B | head -1` exits 1 (a real reader, leaving part-way)."""
    proc = subprocess.Popen([sys.executable, "-m", "kernels_bridge.cli", "diff", OLD, NEW],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 1 and b"configs change" in first and "Traceback" not in err


@pytest.mark.parametrize("argv", [["--help"], ["evaluate", "--help"], ["diff", "--help"], ["attend", "--help"],
                                  ["--version"], ["evaluate"], ["table"]])
def test_a_full_stdout_is_one_error_line_and_exit_2(argv):
    with open("/dev/full", "w") as full:
        proc = _run(argv, full)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["hisparse: cannot write to stdout: No space left on device"]


class _Gone(io.StringIO):
    """A stdout whose reader left after `keep` writes."""

    def __init__(self, keep=0):
        super().__init__()
        self.keep = keep

    def write(self, text):
        if self.keep <= 0:
            raise BrokenPipeError(32, "Broken pipe")
        self.keep -= 1
        return super().write(text)

    def fileno(self):
        raise OSError("no descriptor")


@pytest.mark.parametrize("keep", [0, 1])
def test_main_returns_the_verdict_when_the_reader_leaves(monkeypatch, files, keep):
    """The same through the Python entry point (main), the reader leaving at once or part-way."""
    for argv, verdict in ((["evaluate", "--enable-hisparse", "--kv-cache-dtype", "bfloat16",
                            "--dsa-decode-backend", "flashmla_kv"], 1),
                          (["test", files["tests"]], 1), (["replay", files["records"], "--policy", OLD], 1),
                          (["evaluate", "--batch", files["batch"]], 1),
                          (["evaluate"], 0)):
        monkeypatch.setattr(sys, "stdout", _Gone(keep))
        assert main(argv) == verdict, argv


def test_a_batch_runs_to_its_end_when_nobody_reads_its_answers(files, monkeypatch):
    """Every line is still evaluated (and recorded) after the reader left: the code covers the
    whole input, whatever the buffering, so a rejected line anywhere exits 1."""
    seen = []

    class Counting(_Gone):
        def write(self, text):
            seen.append(text)
            return super().write(text)

    monkeypatch.setattr(sys, "stdout", Counting(2))
    records = os.path.join(os.path.dirname(files["batch"]), "batch-records.jsonl")
    assert main(["evaluate", "--batch", files["batch"], "--format", "json", "--record", records]) == 1
    assert len(seen) == 3  # two answered, the third found the reader gone, no more written
    assert [json.loads(line)["line"] for line in seen[:2]] == [1, 2]
    with open(records, encoding="utf-8") as fh:
        assert sum(1 for _ in fh) == 5004
