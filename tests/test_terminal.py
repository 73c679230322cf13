"""What a person sees in a terminal (issue 28), in a pseudo-terminal of 80 and 120 columns, with NO_COLOR set and not:
no escape at all under NO_COLOR (bold, italic and dim included); no line ending in spaces; a token's text never
broken inside its quotes; inspect's header the walked query's neighbourhood of tokens and their count; inspect
without a model not claiming visible what a window it cannot know might mask; check's verdict the share of printed
kqv elements it could not check; diff -v's node names whole and its rule as wide as its table."""
from __future__ import annotations

import re

import pytest

from conftest import FIXTURES, attncheck as run
from terminal import in_terminal, plain

GPT2 = FIXTURES / "models" / "gpt2-mini-q8_0.gguf"
LONG = FIXTURES / "gpt2-long.txt"  # 13 tokens, " didn't" among them: token texts with spaces and a quote
OLD_LONG, NEW_LONG = FIXTURES / "drift" / "old-llama-gqa-long.txt", FIXTURES / "llama-gqa-long.txt"

COMMANDS = {
    "check": ("check", LONG, "--model", GPT2, "-v"),
    "list": ("list", LONG, "--model", GPT2),
    "inspect": ("inspect", LONG, "--layer", "0", "--head", "0", "--query", "12", "--model", GPT2),
    "diff": ("diff", OLD_LONG, NEW_LONG, "-v"),
}


def _units() -> list[str]:
    """Each token of LONG's run as the screen writes it: its id, a space, its text quoted."""
    doc = run("list", LONG, "--model", GPT2, "--json", "-").json()
    r, = doc["dumps"][0]["runs"]
    return [f"{i} {t!r}" for i, t in zip(r["tokens"], r["token_text"])]


@pytest.mark.parametrize("no_color", [False, True], ids=["color", "NO_COLOR"])
@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_terminal_output_reads_whole(command, columns, no_color):
    code, raw = in_terminal(columns, *COMMANDS[command], no_color=no_color)
    assert code == 0, raw[-2000:]
    if no_color:
        assert "\x1b[" not in raw  # not even bold, italic or dim
    else:
        assert "\x1b[1m" in raw  # the pseudo-terminal gets styles: the test above could fail
    lines = plain(raw)
    assert not [line for line in lines if line.endswith(" ")]
    if command == "diff":
        return
    units = _units()
    for line in lines:  # a token id followed by its opening quote is followed by the whole text and its closing one
        for m in re.finditer(r"(?<![\w.])(\d+) ['\"]", line):
            assert any(line.startswith(u, m.start()) for u in units), (line, units)
    text = "\n".join(lines)
    assert sum(u in text for u in units) >= (11 if command == "inspect" else len(units))


def test_pipes_end_no_line_in_spaces():
    for args in COMMANDS.values():
        r = run(*args)
        assert r.code == 0 and not [line for line in r.out.splitlines() if line.endswith(" ")], args


@pytest.mark.parametrize("columns", [80, 120])
def test_inspect_without_a_model_does_not_claim_a_window_it_cannot_know(columns):
    """Query 12 of 13 sees slots 0..12, of which 0, 1, 2 and 12 are printed: whether a sliding window masks the
    earliest cannot be told from the dump (gpt2 has none: with --model they are visible, and said so)."""
    code, raw = in_terminal(columns, "inspect", LONG, "--layer", "0", "--head", "0", "--query", "12")
    text = " ".join(" ".join(plain(raw)).split())
    assert code == 0
    assert ("mask row: slots 0..12: visible by causality, 0, unless a sliding window masks the earliest (its size is "
            "not known without --model); slots 13..255: empty slot, −inf") in text
    code, raw = in_terminal(columns, "inspect", LONG, "--layer", "0", "--head", "0", "--query", "12", "--model", GPT2)
    assert "mask row: slots 0..12: visible, 0; slots 13..255: empty slot, −inf" in " ".join(" ".join(plain(raw)).split())
    # the default query (2) has its visible slots all printed and within their bounds: they are visible, checked
    doc = run("inspect", LONG, "--layer", "0", "--head", "0", "--json", "-").json()
    assert doc["query"]["index"] == 2 and doc["window_unknown"] is False
    assert run("inspect", LONG, "--layer", "0", "--head", "0", "--query", "12", "--json", "-").json()["window_unknown"]


@pytest.mark.parametrize("columns", [80, 120])
def test_inspect_header_shows_the_querys_neighbourhood_and_a_count(columns):
    code, raw = in_terminal(columns, "inspect", LONG, "--layer", "0", "--head", "0", "--query", "12", "--model", GPT2)
    lines = plain(raw)
    header = " ".join(line.strip("│╭╮╰╯─ ") for line in lines[:lines.index(next(x for x in lines if x.startswith("╰")))])
    header = " ".join(header.split())
    units = _units()
    assert ("tokens of the run: 13; positions 2..12, around the query's (▶): … " + " ".join(units[2:12])
            + " ▶" + units[12]) in header
    assert units[0] not in header and units[1] not in header  # positions 0 and 1: counted, not listed


def test_check_verdict_says_the_share_of_printed_kqv_it_could_not_check():
    r = run("check", LONG, "-q")
    assert r.code == 0
    assert r.out.rstrip().endswith("216 kqv elements checked in 2 sites (1 evaluation); 216 of 432 printed kqv "
                                   "elements (50%) not checkable from the dump alone")
    with_model = run("check", LONG, "-q", "--model", GPT2)  # the model checks them: nothing to say
    assert with_model.code == 0 and "not checkable" not in with_model.out


def test_diff_verbose_keeps_node_names_whole_and_its_rule_as_wide_as_its_table():
    code, raw = in_terminal(120, "diff", OLD_LONG, NEW_LONG, "-v")
    lines = plain(raw)
    start = next(i for i, line in enumerate(lines) if line.startswith("diff "))
    rule = next(i for i in range(start, len(lines)) if "────" in lines[i])
    table = lines[start + 1:rule] + lines[rule + 1:lines.index("", rule)]
    assert max(map(len, table)) <= len(lines[rule].rstrip())
    text = "\n".join(table)
    doc = run("diff", OLD_LONG, NEW_LONG, "--json", "-").json()
    names = {f"{nd[side]['name']}:{nd[side]['line']}" for nd in doc["nodes"] for side in ("old", "new")}
    whole = [n for n in names if " " not in n]  # a name with spaces may wrap between its words, never inside one
    assert whole and all(n in text for n in whole), [n for n in whole if n not in text]


def test_warnings_say_what_was_skipped_and_whether_a_check_needed_it(tmp_path):
    """Real damage of llama.cpp's logs (fixtures/drift/MANIFEST.jsonl, fixtures/MANIFEST.jsonl): a header cut by the
    timings it prints at exit, a node short of a row, a header sharing its line; what a check needs is an error."""
    import lzma

    damaged = tmp_path / "damaged.txt"
    damaged.write_bytes(lzma.decompress((FIXTURES / "drift" / "gpt2-deep-damaged.old.txt.xz").read_bytes()))
    short = tmp_path / "short.txt"
    short.write_bytes(lzma.decompress((FIXTURES / "drift" / "smollm2-how-are.old.txt.xz").read_bytes()))
    said = {path: [line for line in run("check", path, "-q").err.splitlines() if "warning" in line]
            for path in (damaged, short, FIXTURES / "old-llama-gqa-how-are-you.txt")}
    assert said[damaged] == [f"attncheck: warning: {damaged}:5997: damaged header line of 'result_norm' "
                             "(interleaved output?): "
                             "skipped with its body; no attention check needed it"]
    assert said[short] == [f"attncheck: warning: {short}:13672: node 'ffn_gate-29' does not print as its ne "
                           "{1536, 1, 1, 1} says (a line lost, repeated or garbled?); no attention check needed it"]
    assert said[FIXTURES / "old-llama-gqa-how-are-you.txt"][0].endswith(
        ":1125: header of 'result_norm' shares its line with other output: read all the same")
    # with a model, what its checks make of it (hand-made: no shipped model made a damaged dump): a row of a node
    # no attention check reads, lost
    from dumpedit import DumpEdit

    edit = DumpEdit(FIXTURES / "gpt2-how-are.txt", tmp_path / "lost-row.txt")
    at = edit.line_of("ffn_norm-0", (0, 0, 1))
    del edit.lines[at]
    r = run("check", edit.save(), "--model", GPT2)
    assert r.code == 0
    assert f"lost-row.txt:{edit.headers('ffn_norm-0')[0] + 1}: node 'ffn_norm-0' does not print as its ne " \
           "{768, 2, 1, 1} says (a line lost, repeated or garbled?); no attention check needed it; --model checks " \
           "skip it" in r.err
    assert "not checked against the model: 1 node: does not print as its ne says" in " ".join(r.out.split())
