"""A --model's GGUF header is read once per command (arch/context.py): the command opens the model before its dumps and
hands the context to what needs it (the checks of every dump, the reference, the page's vocabulary, diff's two
sides). Counted by the header reader's cursor, which reads every header once from its start; the commands run in
this process so that the count sees them (run's llama.cpp is a stand-in printing a real dump: tests/standin.py)."""
from __future__ import annotations

import pytest

from attncheck.arch import gguf_header
from attncheck.cli import main

from conftest import FIXTURES

GPT2 = FIXTURES / "models" / "gpt2-mini-q8_0.gguf"
HOW_ARE, YOU = FIXTURES / "gpt2-how-are.txt", FIXTURES / "gpt2-how-are-you.txt"


@pytest.fixture
def reads(monkeypatch) -> list[str]:
    """The paths of the headers read, one entry per read."""
    out: list[str] = []

    class Counted(gguf_header._Cursor):
        def __init__(self, buf, path):
            out.append(path)
            super().__init__(buf, path)

    monkeypatch.setattr(gguf_header, "_Cursor", Counted)
    return out


def command(*args) -> int:
    """An attncheck command run in this process: its exit code."""
    with pytest.raises(SystemExit) as e:
        main.main([str(a) for a in args], prog_name="attncheck", standalone_mode=False)
    return e.value.code


def test_the_counter_counts(reads):
    gguf_header.read_header(GPT2)
    gguf_header.read_header(GPT2)
    assert reads == [str(GPT2)] * 2


def test_check_with_a_model_and_a_page_reads_the_header_once(reads, tmp_path):
    assert command("check", HOW_ARE, YOU, "--model", GPT2, "--html", tmp_path / "p.html", "-q") == 0
    assert reads == [str(GPT2)]
    assert (tmp_path / "p.html").stat().st_size > 10_000


def test_run_with_a_page_reads_the_header_once(reads, tmp_path):
    from standin import stand_in

    fake, _ = stand_in(tmp_path, HOW_ARE)
    assert command("run", "-m", GPT2, "-p", "How are", "--bin", fake, "--html", tmp_path / "p.html", "-q") == 0
    assert reads == [str(GPT2)]


@pytest.mark.parametrize("args", [("list", HOW_ARE, YOU, "--json", "-"),
                                  ("diff", HOW_ARE, YOU, "--prefix", "-q"),
                                  ("inspect", HOW_ARE, "--layer", "1", "--head", "2", "--json", "-"),
                                  ("inspect", FIXTURES / "gpt2-flash-attn.txt", "--layer", "1", "--head", "2",
                                   "--json", "-")],
                         ids=["list", "diff", "inspect", "inspect-flash"])
def test_every_other_command_reads_the_header_once(reads, tmp_path, args):
    command(*args, "--model", GPT2, *(["--html", tmp_path / "p.html"] if args[0] in ("diff", "inspect")
                                      and "flash" not in str(args[1]) else []))
    assert reads == [str(GPT2)]
