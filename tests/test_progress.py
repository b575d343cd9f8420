"""The progress line of a step that cannot count (engine.progress.Waiting), and conform saying
that it is importing SGLang while it does."""
import io

import pytest

from engine.progress import Waiting


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_waiting_says_so_at_once_and_closes_its_line():
    now = [100.0]
    log = io.StringIO()
    with Waiting("conform: importing SGLang", stream=log, every=3600, clock=lambda: now[0]):
        assert log.getvalue() == "conform: importing SGLang... 0s\n"  # before the step, not after
        now[0] += 34
    assert log.getvalue() == "conform: importing SGLang... 0s\nconform: importing SGLang... 34s\n"
    tty = Tty()
    with pytest.raises(KeyError):  # a step that fails closes the line too
        with Waiting("loading", stream=tty, clock=lambda: now[0]):
            raise KeyError("x")
    assert tty.getvalue() == "\rloading... 0s\rloading... 0s\n"


def test_conform_shows_the_import_of_sglang(monkeypatch):
    import engine
    from engine.files.shipped import DEFAULT_POLICY
    from engine.sglang import conform as package
    from engine.sglang.conform import drivers

    stream = io.StringIO()
    seen = []

    def installed():
        seen.append(stream.getvalue())  # what was on stderr while SGLang imported
        return None, "SGLang is not installed in this Python"

    monkeypatch.setattr(drivers, "installed_sglang", installed)
    with pytest.raises(package.SGLangUnavailable):
        package.conform(engine.load_policy(DEFAULT_POLICY), progress=stream)
    assert seen == ["conform: importing SGLang... 0s\n"]
    assert stream.getvalue().startswith(seen[0]) and stream.getvalue().count("\n") == 2
