"""Every file a command reads is a regular file, or (for the inputs that may be streams: --config,
--batch, replay, a launch command's --config) a pipe or FIFO whose writer is waited for. Anything
else (/dev/null, /dev/zero, a terminal, a directory, a socket) is refused before a byte is read:
exit 2, one line, never an answer on no input. A pipe of zeros is never held whole, whatever
HISPARSE_MAX_FILE_BYTES allows. Records are appended to regular files only, through the API too."""
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time

import pytest

import engine
from engine.errors import ConfigError
from engine.files.shipped import DEFAULT_POLICY
from engine.serving.records import append_records, replay
from tests.helpers import ROOT, run_cli


def _socket(p):
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(p))
    return s


@pytest.fixture
def specials(tmp_path):
    folder = tmp_path / "folder"
    folder.mkdir()
    fifo = tmp_path / "fifo-no-writer"
    os.mkfifo(fifo)
    null_link = tmp_path / "null.yaml"
    os.symlink(os.devnull, null_link)
    sock = _socket(tmp_path / "sock")
    yield {"/dev/null": os.devnull, "/dev/zero": "/dev/zero", "a directory": str(folder),
           "a link to /dev/null": str(null_link), "a socket": str(tmp_path / "sock")}
    sock.close()


STREAM_INPUTS = [["evaluate", "--config", "{}"], ["explain", "--config", "{}"], ["evaluate", "--batch", "{}"],
                 ["replay", "{}"], ["evaluate", "--", "python", "-m", "sglang.launch_server", "--config", "{}"]]
FILE_INPUTS = [["evaluate", "--policy", "{}"], ["check", "{}"], ["test", "{}"], ["diff", "{}", DEFAULT_POLICY],
               ["evaluate", "--record", "{}"]]


@pytest.mark.parametrize("argv", STREAM_INPUTS + FILE_INPUTS, ids=lambda a: " ".join(a[:3]))
def test_special_files_are_refused_unread(capsys, specials, argv):
    for what, path in specials.items():
        if argv[0] in ("check", "test") and what == "a directory":
            continue  # check and test read a folder as a folder of policies (tested elsewhere)
        code, out, err = run_cli(capsys, *[a.format(path) for a in argv])
        if "--policy" in argv and what == "a directory":  # --policy DIR names a folder of policies
            assert code == 2 and "R601: no policy family in the folder" in err, (argv, out, err)
            continue
        assert code == 2, (what, argv, out, err)
        assert "ACCEPTED" not in out and "recorded decisions" not in out, (what, argv)
        assert "internal error" not in err and "Traceback" not in err
        text = out + err
        assert any(w in text for w in ("not a regular file", "is a directory", "a regular file")), (what, argv, text)


def test_a_model_folder_whose_config_json_is_special_is_c504(capsys, tmp_path):
    for name, make in (("null", lambda p: os.symlink(os.devnull, p)), ("fifo", os.mkfifo), ("dir", os.mkdir)):
        model = tmp_path / name
        model.mkdir()
        make(model / "config.json")
        code, _, err = run_cli(capsys, "evaluate", "--model-path", str(model))
        assert code == 2 and "C504: model config" in err, err


def _later_writer(path, data: bytes, delay: float = 0.3):
    """A writer that comes after the reader has opened (the old reader saw no input then)."""
    def write():
        time.sleep(delay)
        with open(path, "wb") as fh:
            fh.write(data)
    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("how", ["config", "batch", "launch"])
def test_a_fifo_is_waited_for_and_its_content_decides(capsys, tmp_path, how):
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    if how == "batch":
        writer = _later_writer(fifo, b'{"kv_cache_dtype": "fp8_e4m3"}\n{"kv_cache_dtype": "nope"}\n')
        code, out, _ = run_cli(capsys, "evaluate", "--batch", fifo)
        lines = [json.loads(line) for line in out.splitlines()]
        assert code == 2 and lines[0]["backends"]["decode"] == "flashmla_kv" and lines[1]["error"]["code"] == "C502"
    else:
        writer = _later_writer(fifo, b"kv-cache-dtype: fp8_e4m3\n")
        argv = ["--config", fifo] if how == "config" else ["--", "python", "-m", "sglang.launch_server", "--config", fifo]
        code, out, _ = run_cli(capsys, "evaluate", "--format", "json", *argv)
        assert code == 0 and json.loads(out)["backends"]["decode"] == "flashmla_kv"
    writer.join()


def test_replay_waits_for_a_fifo_writer(tmp_path):
    records = tmp_path / "r.jsonl"
    append_records(str(records), [engine.evaluate(DEFAULT_POLICY, {"kv_cache_dtype": "fp8_e4m3"})])
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    writer = _later_writer(fifo, records.read_bytes())
    result = replay(fifo, engine.load_policy(DEFAULT_POLICY))
    writer.join()
    assert result["total"] == 1


def test_append_records_refuses_a_fifo_nobody_reads_and_a_device(tmp_path):
    """A FIFO would take the record into its buffer with no one to read it: the record is lost,
    so it is refused (and the open never waits for a reader)."""
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    decision = engine.evaluate(DEFAULT_POLICY, {})
    for path in (fifo, os.devnull, str(tmp_path)):
        with pytest.raises(ConfigError) as info:
            append_records(path, [decision])
        assert info.value.problems[0].code == "C504"
    assert "a record file is a regular file" in str(
        pytest.raises(ConfigError, append_records, fifo, [decision]).value)


def _limited(limit):
    def setup():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return setup


@pytest.mark.parametrize("argv", [["evaluate", "--config", "/dev/stdin"], ["evaluate", "--batch", "-"],
                                  ["replay", "-"], ["evaluate", "--config", "/dev/zero"]])
def test_zeros_through_a_pipe_are_never_held_whole(argv):
    """With the size limit raised to 8 GB and the address space capped at 1.5 GB, a pipe of 64 MB
    of zeros (or /dev/zero named) ends in one error line, never a MemoryError."""
    env = dict(os.environ, HISPARSE_MAX_FILE_BYTES="8000000000", PYTHONPATH=ROOT)
    zeros = subprocess.Popen(["head", "-c", str(64 << 20), "/dev/zero"], stdout=subprocess.PIPE)
    proc = subprocess.run([sys.executable, "-m", "engine.cli", *argv], stdin=zeros.stdout, capture_output=True,
                          text=True, cwd=ROOT, env=env, preexec_fn=_limited(3 << 29), timeout=300)
    zeros.stdout.close()
    zeros.wait()
    assert proc.returncode == 2, proc.stderr
    assert "MemoryError" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
