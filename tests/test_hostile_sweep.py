"""Every command of `hisparse` under hostile arguments, as a process with a bounded address space
(RLIMIT_AS): it exits 0, 1 or 2, within its time limit, and prints no traceback, no "internal
error" and no raw terminal control character. The cases are classes, one or more per command:
huge integers, devices and FIFOs where files are read or written, closed and full standard
streams, control characters, collisions of a policy's flags with a command's options, workloads
past the memory limit, devices that do not exist, tampered records.
"""
import json
import os
import re
import resource
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.helpers import ROOT, minimal_text

ADDRESS_SPACE = 3 << 30  # torch maps about 0.7 GB at import; nothing here needs more than 3 GB
CASE_TIMEOUT = 60  # a hang is a failure, not a wait (the cases take well under a second each)
BIG = "9" * 5000
ESC = "\x1b[2J\x1b[31mACCEPTED\r\x9b"
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep")
    fifo = d / "fifo"
    os.mkfifo(fifo)
    for name in ("fifo-batch", "fifo-replay", "fifo-config"):  # each read by one case, with its writer
        os.mkfifo(d / name)
    record = d / "records.jsonl"
    good = subprocess.run([sys.executable, "-m", "kernels_bridge.cli", "evaluate", "--enable-hisparse",
                           "--disable-radix-cache", "--record", str(record)], cwd=ROOT, capture_output=True)
    assert good.returncode == 0, good.stderr
    rec = json.loads(record.read_text())
    tampered = []
    for mutate in (lambda r: r["input"].update(kv_cache_dtype=["x"]),
                   lambda r: r["decision"].update(backends={"decode": {"a": 1}}),
                   lambda r: r["decision"].update(violations=[1, 2]),
                   lambda r: r["decision"].update(ok="yes"),
                   lambda r: r.update(input=[])):
        r = json.loads(json.dumps(rec))
        mutate(r)
        tampered.append(json.dumps(r))
    tampered.append(json.dumps(rec).replace('"sm_major": 9', '"sm_major": ' + BIG))
    tampered.append('{"input": {}, "decision": {"ok": true, "backends": {}}}' + " " * 100)
    (d / "tampered.jsonl").write_text("\n".join(tampered) + "\n")
    # a policy whose input flags take the names of attend's own options
    collide = minimal_text().replace("  sm_major:\n    type: int\n",
                                     "  sm_major:\n    type: int\n    flags: [--steps]\n")
    (d / "collide").mkdir()
    (d / "collide" / "v1.yaml").write_text(collide.replace("policy: mini", "policy: collide"))
    # YAML refuses raw controls, but its double-quoted escapes make them
    message = minimal_text().replace("(SM{sm_major})", "(SM{sm_major}) \\e[2J\\rACCEPTED \\u202e\\x9b")
    (d / "controls.yaml").write_text(message.replace("policy: mini", "policy: controls"))
    (d / "config.yaml").write_text('"kv-cache-dtyp\\e[31m": fp8_e4m3\n"tp\\r": 8\nmodel-path: "evil\\e[2J\\r"\n')
    return {"dir": str(d), "fifo": str(fifo), "record": str(record), "tampered": str(d / "tampered.jsonl"),
            "collide": str(d / "collide" / "v1.yaml"), "controls": str(d / "controls.yaml"),
            "config": str(d / "config.yaml")}


def cases(f):
    """(name, argv, how): how is None, or one of stdin-zero, stdin-closed, stdout-full,
    stdout-closed."""
    launch = ["--", "python", "-m", "sglang.launch_server"]
    small = ["--requests", "1", "--context", "128", "--steps", "1", "--heads", "64",
             "--hisparse-top-k", "128", "--hisparse-device-buffer-size", "128"]
    return [
        # huge integers wherever a number is read from text
        ("evaluate int flag", ["evaluate", "--sm-major", BIG], None),
        ("evaluate policy version", ["evaluate", "--policy", "dsa-backends@" + BIG], None),
        ("evaluate --hisparse-config", ["evaluate", *launch, "--hisparse-config", '{"top_k": %s}' % BIG], None),
        ("evaluate --hisparse-config deep", ["evaluate", *launch, "--hisparse-config", "[" * 10000], None),
        ("evaluate launch int", ["evaluate", *launch, "--sm-major", BIG], None),
        ("table --where int", ["table", "--where", "sm_major=" + BIG], None),
        ("diff --where int", ["diff", "dsa-backends@1", "dsa-backends@2", "--where", "sm_major=" + BIG], None),
        ("diff --max-patterns", ["diff", "dsa-backends@1", "dsa-backends@2", "--max-patterns", BIG], None),
        ("test --min-coverage", ["test", "--min-coverage", "1e999"], None),
        ("replay --max-records", ["replay", f["record"], "--max-records", BIG], None),
        ("attend --seed float", ["attend", "--seed", "1e30", *small], None),
        ("attend --seed big", ["attend", "--seed", BIG, *small], None),
        ("env limit", ["evaluate", "--config", f["config"]], "env-big-limit"),
        # the launch command after --
        ("unbalanced quote", ["evaluate", "--", "python -m sglang.launch_server --model-path 'x"], None),
        ("misspelt flag", ["evaluate", "--kv-cache-dtpye", "fp8_e4m3"], None),
        # devices and FIFOs where a file is read or written
        ("batch /dev/zero", ["evaluate", "--batch", "/dev/zero"], None),
        ("batch stdin /dev/zero", ["evaluate", "--batch", "-"], "stdin-zero"),
        ("batch fifo", ["evaluate", "--batch", f["dir"] + "/fifo-batch"], "fifo-writer"),
        ("config fifo", ["evaluate", "--config", f["dir"] + "/fifo-config"], "fifo-writer"),
        ("batch stdin closed", ["evaluate", "--batch", "-"], "stdin-closed"),
        ("record fifo", ["evaluate", "--record", f["fifo"]], None),
        ("record /dev/full", ["evaluate", "--record", "/dev/full"], None),
        ("config /dev/zero", ["evaluate", "--config", "/dev/zero"], None),
        ("policy /dev/zero", ["evaluate", "--policy", "/dev/zero"], None),
        ("check fifo", ["check", f["fifo"], "/dev/zero", f["dir"]], None),
        ("test /dev/zero", ["test", "/dev/zero"], None),
        ("replay /dev/zero", ["replay", "/dev/zero"], None),
        ("replay fifo", ["replay", f["dir"] + "/fifo-replay"], "fifo-writer"),
        ("replay stdin zero", ["replay", "/dev/stdin"], "stdin-zero"),
        ("replay tampered", ["replay", f["tampered"]], None),
        # closed and full standard streams
        ("evaluate > /dev/full", ["evaluate"], "stdout-full"),
        ("batch > /dev/full", ["evaluate", "--batch", f["record"]], "stdout-full"),
        ("explain >&-", ["explain"], "stdout-closed"),
        ("table > /dev/full", ["table", "--format", "json"], "stdout-full"),
        ("doctor > /dev/full", ["doctor"], "stdout-full"),
        ("version > /dev/full", ["--version"], "stdout-full"),
        ("check >&-", ["check", "--no-deep"], "stdout-closed"),
        # terminal control characters in what is printed back
        ("control in value", ["evaluate", "--kv-cache-dtype", ESC], None),
        ("control in policy message", ["evaluate", "--policy", f["controls"], "--kv-cache-dtype", "fp8_e4m3",
                                       "--decode-backend", "flashmla_sparse"], None),
        ("control in explain", ["explain", "--policy", f["controls"], "--decode-backend", "flashmla_kv"], None),
        ("control in config key", ["evaluate", "--config", f["config"]], None),
        ("control in model path", ["evaluate", *launch, "--model-path", ESC], None),
        ("control in --where", ["table", "--where", "kv_cache_dtype=" + ESC], None),
        ("control in command", [ESC], None),
        ("control in path", ["check", os.path.join(f["dir"], ESC)], None),
        # a policy whose flags collide with a command's options
        ("check collide", ["check", "--no-deep", f["collide"]], None),
        ("attend collide", ["attend", "--policy", f["collide"], *small], None),
        # workloads and devices the bridge cannot serve
        ("attend huge buffer", ["attend", *small[:-2], "--hisparse-device-buffer-size", "4194304"], None),
        ("attend missing gpu", ["attend", *small, "--device", "cuda:7"], None),
        ("attend meta device", ["attend", *small, "--device", "meta"], None),
        ("attend bad memory", ["attend", *small, "--max-memory", "-5G"], None),
        ("doctor bad format", ["doctor", "--format", "yaml"], None),
    ]


def _write_fifo(path):
    try:
        with open(path, "wb") as fh:
            fh.write(b'{"kv_cache_dtype": "\\u001b[2J"}\n\x00\xff\n' + b"x" * 100_000 + b"\n")
    except BrokenPipeError:  # the command may refuse the input and close before it is all written
        pass


def _child(how):
    def setup():
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
        if how == "stdout-closed":
            os.close(1)
        if how == "stdin-closed":
            os.close(0)
    return setup


def _run(f, case):
    name, argv, how = case
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("HISPARSE_DEBUG", None)
    if how == "env-big-limit":
        env["HISPARSE_MAX_FILE_BYTES"] = BIG
    stdin = open("/dev/zero", "rb") if how == "stdin-zero" else subprocess.DEVNULL
    stdout = open("/dev/full", "w") if how == "stdout-full" else subprocess.PIPE
    if how == "fifo-writer":  # a FIFO is waited for: its writer comes, writes hostile lines, leaves
        fifo = argv[-1]
        writer = threading.Thread(target=_write_fifo, args=(fifo,), daemon=True)
        writer.start()
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "kernels_bridge.cli", *argv], cwd=f["dir"], env=env,
                              stdin=stdin, stdout=stdout, stderr=subprocess.PIPE, timeout=CASE_TIMEOUT,
                              preexec_fn=_child(how))
    except subprocess.TimeoutExpired:
        return name, None, "", f"timed out after {CASE_TIMEOUT} s"
    finally:
        if how == "fifo-writer":  # a command that never opened it: release the writer
            try:
                os.close(os.open(argv[-1], os.O_RDONLY | os.O_NONBLOCK))
            except OSError:
                pass
            writer.join(5)
        for s in (stdin, stdout):
            if hasattr(s, "close"):
                s.close()
    out = proc.stdout.decode("utf-8", "replace") if proc.stdout else ""
    if os.environ.get("HISPARSE_FIGURES"):
        print(f"{time.monotonic() - start:6.2f} s  {name}")
    return name, proc.returncode, out, proc.stderr.decode("utf-8", "replace")


def test_every_command_survives_hostile_arguments(files):
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda c: _run(files, c), cases(files)))
    bad = []
    for name, code, out, err in results:
        text = out + err
        if code not in (0, 1, 2):
            bad.append(f"{name}: exit {code}: {err[-300:]}")
        elif "Traceback" in text or "internal error" in text or "Exception ignored" in text:
            bad.append(f"{name}: {text[-300:]}")
        elif RAW_CONTROL.search(text):
            bad.append(f"{name}: a raw control character in {text[-200:]!r}")
    assert not bad, "\n".join(bad)
    by_name = {name: (code, out, err) for name, code, out, err in results}
    # what the operator is told, for the classes that used to crash or hang
    assert by_name["evaluate > /dev/full"][0] == 2
    assert "cannot write to stdout: No space left on device" in by_name["evaluate > /dev/full"][2]
    assert "cannot write to stdout: it is closed" in by_name["explain >&-"][2]
    assert by_name["batch stdin /dev/zero"][0] == 2 and "character device" in by_name["batch stdin /dev/zero"][2]
    assert by_name["record fifo"][0] == 2 and "a record file is a regular file" in by_name["record fifo"][2]
    # --steps is attend's option, not the language's: check accepts the policy, attend refuses it
    assert by_name["check collide"][0] == 0, by_name["check collide"]
    assert by_name["attend collide"][0] == 2 and "E309" in by_name["attend collide"][2]
    assert "input 'sm_major' takes the flag --steps" in by_name["attend collide"][2]
    assert by_name["attend huge buffer"][0] == 2
    assert "--hisparse-device-buffer-size: this workload needs" in by_name["attend huge buffer"][2]
    assert by_name["replay tampered"][0] == 2 and by_name["replay tampered"][1].count("C505") == 5
    assert "\\x1b[2J" in by_name["control in policy message"][1]
    assert "did you mean '--kv-cache-dtype'?" in by_name["misspelt flag"][2]
