"""What a user of the installed wheel (no checkout) needs: `hisparse policies export` gives the
shipped policies to edit, the wheel carries every file it exports, and messages name the policy
file where it really is."""
import fnmatch
import os
import re
import subprocess
import sys
import tomllib

from engine.cli.policies import shipped_files
from engine.files.shipped import shipped_policy_dir
from tests.helpers import ROOT, run_cli


def test_export_copies_the_shipped_policies_their_tests_and_the_schema(capsys, tmp_path):
    dest = tmp_path / "my-policies"
    code, out, _ = run_cli(capsys, "policies", "export", str(dest))
    assert code == 0
    written = sorted(os.path.relpath(os.path.join(base, f), dest) for base, _, files in os.walk(dest) for f in files)
    assert written == sorted(shipped_files())
    assert {"schema/policy.schema.json", "schema/tests.schema.json"} <= set(written)
    assert any(re.fullmatch(r"[a-z-]+/tests/v\d+\.yaml", f) for f in written)
    for rel in written:
        with open(dest / rel, "rb") as a, open(os.path.join(shipped_policy_dir(), rel), "rb") as b:
            assert a.read() == b.read()
    assert out.startswith(f"exported {len(written)} files to {dest}: ")
    assert run_cli(capsys, "check", "--no-deep", str(dest))[0] == 0
    code, out, _ = run_cli(capsys, "test", str(dest))
    assert code == 0, out
    family = written[0].split("/")[0]
    code, out, _ = run_cli(capsys, "evaluate", "--policy-dir", str(dest), "--policy", family)
    assert code == 0 and str(dest) in out  # by name from the copy, named where it is


def test_export_never_writes_into_a_folder_that_has_files(capsys, tmp_path):
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "notes.txt").write_text("keep me")
    code, _, err = run_cli(capsys, "policies", "export", str(dest))
    assert code == 2 and "exists and is not an empty folder" in err
    assert os.listdir(dest) == ["notes.txt"] and sorted(os.listdir(tmp_path)) == ["mine"]  # no staging left
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run_cli(capsys, "policies", "export", str(empty))[0] == 0 and os.listdir(empty)
    code, _, err = run_cli(capsys, "policies", "import", str(tmp_path / "x"))
    assert code == 2 and "invalid choice" in err


def test_the_wheel_carries_every_file_export_copies():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        project = tomllib.load(fh)
    data = project["tool"]["setuptools"]["package-data"]
    patterns = [p for p in data["engine.policies"]] + [f"schema/{p}" for p in data["engine.policies.schema"]]
    missing = [f for f in shipped_files() if not any(fnmatch.fnmatch(f, p) for p in patterns)]
    assert not missing


def test_messages_name_the_policy_file_where_it_is(tmp_path):
    """From a checkout's root the shipped file is `policies/...`; from anywhere else (as with an
    installed wheel) its real path: never a relative path that does not exist there."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HISPARSE_POLICY")}
    env["PYTHONPATH"] = ROOT
    argv = [sys.executable, "-m", "engine.cli", "evaluate", "--enable-hisparse", "--disable-radix-cache"]
    for cwd in (ROOT, str(tmp_path)):
        out = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120).stdout
        paths = re.findall(r"\(([^()\s]+\.yaml):\d+\)", out) + re.findall(r"policy: \S+ (\S+\.yaml) ", out)
        assert len(paths) == 3, out
        for path in paths:
            assert os.path.exists(os.path.join(cwd, path)), (cwd, path)
        if cwd == ROOT:
            assert paths[0].startswith("policies" + os.sep)
        else:
            assert os.path.isabs(paths[0])
        proc = subprocess.run(argv[:3] + ["explain", "--enable-hisparse"], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=120)
        shown = re.match(r"Policy \S+ \((\S+\.yaml), ", proc.stdout).group(1)
        assert os.path.exists(os.path.join(cwd, shown))


def test_export_into_an_empty_folder_writes_into_it_keeping_its_mode(capsys, tmp_path):
    dest = tmp_path / "private"
    dest.mkdir()
    dest.chmod(0o700)
    inode = os.stat(dest).st_ino
    assert run_cli(capsys, "policies", "export", str(dest))[0] == 0
    assert stat_mode(dest) == 0o700 and os.stat(dest).st_ino == inode  # the folder itself, not a new one
    assert sorted(os.listdir(tmp_path)) == ["private"] and not [n for n in os.listdir(dest) if n.startswith(".")]


def stat_mode(path) -> int:
    return os.stat(path).st_mode & 0o777


def test_export_into_an_empty_folder_of_ones_own_inside_a_read_only_folder(tmp_path):
    """As a user who owns the empty folder but may not write in its parent (judged by a child that
    gives up root first: root may write anywhere)."""
    import tempfile

    shared = tempfile.mkdtemp(prefix="hisparse-export-")
    os.chmod(shared, 0o755)
    parent, mine = os.path.join(shared, "ro"), os.path.join(shared, "ro", "mine")
    os.makedirs(mine)
    nobody = 65534
    try:
        for path, mode in ((mine, 0o700), (parent, 0o555)):
            os.chmod(path, mode)
            if os.geteuid() == 0:
                os.chown(path, nobody, nobody)
        # what export imports is imported first: the interpreter's own files may be root's alone
        code = ("import os, sys, shutil, tempfile\nfrom engine.cli.policies import export\n"
                f"if os.geteuid() == 0:\n    os.setgid({nobody}); os.setuid({nobody})\n"
                "print(len(export(sys.argv[1])))\n")
        proc = subprocess.run([sys.executable, "-c", code, mine], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert int(proc.stdout) == len(shipped_files()) and os.path.isfile(os.path.join(mine, "schema",
                                                                                          "policy.schema.json"))
        assert stat_mode(mine) == 0o700 and os.listdir(parent) == ["mine"]
    finally:
        os.chmod(parent, 0o755)
        import shutil

        shutil.rmtree(shared)
