"""--fail-fast stops at the first failing site; the progress bar shows only on a terminal, past a few MB."""
from __future__ import annotations

import sys
from types import SimpleNamespace

from conftest import FIXTURES, attncheck as run
from dumpedit import DumpEdit

from attncheck.cli import progress


def test_fail_fast_stops_at_the_first_failing_site(tmp_path):
    edit = DumpEdit(FIXTURES / "gpt2-ubatch2.txt", tmp_path / "d.txt")
    edit.add("kqv-0", (0, 0, 0), 0.05)  # evaluation 0, layer 0: the first site checked
    path = edit.save()
    whole = run("check", path, "--json", "-").json()
    assert whole["exit_code"] == 1 and len(whole["sites"]) == 6 and not whole["stopped_early"]
    fast = run("check", path, "--fail-fast", "--json", "-").json()
    assert fast["exit_code"] == 1 and fast["stopped_early"]
    assert [(s["evaluation"], s["layer"], s["passed"]) for s in fast["sites"]] == [(0, 0, False)]


def test_progress_only_on_a_terminal_and_not_quiet_or_in_ci(monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    monkeypatch.delenv("CI", raising=False)
    assert progress.wanted(quiet=False)
    assert not progress.wanted(quiet=True)
    monkeypatch.setenv("CI", "true")
    assert not progress.wanted(quiet=False)
    monkeypatch.delenv("CI")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    assert not progress.wanted(quiet=False)


def test_progress_bar_starts_only_past_a_few_megabytes():
    dump = SimpleNamespace(source="d.txt", bytes_read=1 << 20)
    with progress.evaluation_progress(str(FIXTURES / "gpt2-how-are.txt"), enabled=True) as update:
        update(dump, None)
        assert update.task is None  # a small input finishes before a bar would help
        dump.bytes_read = progress.SHOW_AFTER + 1
        update(dump, None)
        assert update.task is not None and update.evaluations == 2
    with progress.evaluation_progress(str(FIXTURES / "gpt2-how-are.txt"), enabled=False) as update:
        assert update is None
