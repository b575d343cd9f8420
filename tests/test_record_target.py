"""A record file that cannot be appended to is refused before anything runs (docs/plugin.md):
`engine.files.streams.check_record_target`, which `evaluate --record`, `launch --record` (and
HISPARSE_RECORD in its environment) and the SGLang plugin call: a folder that does not exist, a
read-only file, a file in a read-only folder. Root may write either, so those two are judged by
a child process that gives up root first."""
import os
import stat
import subprocess
import sys
import tempfile

import pytest

from engine.errors import ConfigError
from engine.files.streams import check_record_target
from tests.helpers import ROOT, run_cli, run_process

NOBODY = 65534
LAUNCH = ["--", "python", "-m", "sglang.launch_server", "--model-path", "deepseek-ai/DeepSeek-V3.2",
          "--enable-hisparse", "--disable-radix-cache", "--kv-cache-dtype", "fp8_e4m3"]


def _judged_unprivileged(path: str) -> str:
    """check_record_target's verdict on `path` in a process that cannot override file modes: this
    one where it is not root, else a child that drops to an unprivileged user after importing."""
    code = ("import os, sys\nfrom engine.files.streams import check_record_target\n"
            "from engine.errors import ConfigError\n"
            f"if os.geteuid() == 0:\n    os.setgid({NOBODY}); os.setuid({NOBODY})\n"
            "try:\n    check_record_target(sys.argv[1])\n    print('ok')\n"
            "except ConfigError as exc:\n    print(exc.problems[0])\n")
    proc = subprocess.run([sys.executable, "-c", code, path], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.fixture
def shared_dir():
    """A folder every user may enter (tmp_path sits under a folder only its owner may)."""
    folder = tempfile.mkdtemp(prefix="hisparse-record-")
    os.chmod(folder, 0o755)
    yield folder
    for name in os.listdir(folder):
        os.chmod(os.path.join(folder, name), 0o755)
    os.chmod(folder, 0o755)
    import shutil

    shutil.rmtree(folder)


def _unprivileged_owned(path: str, mode: int) -> None:
    os.chmod(path, mode)
    if os.geteuid() == 0:
        os.chown(path, NOBODY, NOBODY)


def test_a_folder_that_does_not_exist_is_refused(tmp_path):
    path = str(tmp_path / "no" / "such" / "r.jsonl")
    with pytest.raises(ConfigError, match=r"C504: cannot append records to this file: its folder .*/no/such does not exist"):
        check_record_target(path)
    assert not os.path.exists(tmp_path / "no")


def test_a_read_only_file_is_refused(shared_dir):
    path = os.path.join(shared_dir, "r.jsonl")
    open(path, "w").close()
    _unprivileged_owned(path, 0o444)
    assert "may not write to it" in _judged_unprivileged(path)
    _unprivileged_owned(path, 0o644)
    assert _judged_unprivileged(path) == "ok"


def test_a_new_file_in_a_read_only_folder_is_refused(shared_dir):
    folder = os.path.join(shared_dir, "ro")
    os.mkdir(folder)
    _unprivileged_owned(folder, 0o555)
    assert "may not create files in its folder" in _judged_unprivileged(os.path.join(folder, "r.jsonl"))
    _unprivileged_owned(folder, 0o755)
    assert _judged_unprivileged(os.path.join(folder, "r.jsonl")) == "ok"


def test_a_file_that_can_be_appended_to_passes_and_is_not_created(tmp_path):
    new = tmp_path / "r.jsonl"
    check_record_target(str(new))
    assert not new.exists()
    new.write_text("")
    check_record_target(str(new))


def test_evaluate_refuses_the_record_file_before_deciding(tmp_path, capsys):
    code, out, err = run_cli(capsys, "evaluate", "--enable-hisparse", "--record", str(tmp_path / "nowhere" / "r.jsonl"))
    assert code == 2 and out == "" and "C504" in err and "does not exist" in err


@pytest.mark.parametrize("how", ["option", "environment"])
def test_launch_refuses_the_record_file_before_starting_sglang(tmp_path, how):
    path = str(tmp_path / "no" / "such" / "r.jsonl")
    if how == "option":
        proc = run_process("launch", "--record", path, *LAUNCH)
    else:  # the plugin would find it only inside SGLang, at its first decision
        proc = run_process("launch", *LAUNCH, env={"HISPARSE_RECORD": path})
    assert proc.returncode == 2, proc.stderr
    assert "C504" in proc.stderr and "does not exist" in proc.stderr
    assert "accepts this launch" not in proc.stderr and proc.stdout == ""
