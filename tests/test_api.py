"""One Python function per command (issue 28), each returning the object the command's JSON is made from: the same
document, the same exit code, on the real dumps of fixtures/."""
from __future__ import annotations

import json

import pytest

import attncheck
from conftest import FIXTURES, attncheck as cli

GPT2 = FIXTURES / "models" / "gpt2-mini-q8_0.gguf"
HOW_ARE = FIXTURES / "gpt2-how-are.txt"


def _same(doc: dict) -> dict:
    """A document as the JSON file holds it (tuples as lists, keys as strings)."""
    return json.loads(json.dumps(doc))


@pytest.mark.parametrize("model", [None, GPT2], ids=["dump-only", "model"])
def test_verify_is_check(model):
    args = ("check", HOW_ARE, "--json", "-") + (("--model", GPT2) if model else ())
    report = attncheck.verify(str(HOW_ARE), model=None if model is None else str(model))
    assert isinstance(report, attncheck.Report)
    assert _same(report.to_dict()) == cli(*args).json() and report.exit_code == 0
    if model:
        assert report.totals()["model_kq_elements_checked"] == 144


@pytest.mark.parametrize("pair,options,code", [
    (("gpt2-how-are-you.txt", "gpt2-kv-f32.txt"), {"exact": True}, 1),
    (("gpt2-how-are-you.txt", "gpt2-kv-f32.txt"), {}, 0),
    (("drift/phi3-cat.old.txt", "drift/phi3-cat.new.txt"), {}, 1),
])
def test_diff_is_diff(pair, options, code):
    old, new = (str(FIXTURES / p) for p in pair)
    rep = attncheck.diff(old, new, **options)
    assert rep.exit_code == code
    assert _same(rep.to_dict()) == cli("diff", old, new, "--json", "-", *(["--exact"] if options else [])).json()


def test_diff_with_the_model_checks_both_sides():
    old, new = str(FIXTURES / "gpt2-how-are-you.txt"), str(FIXTURES / "gpt2-kv-f32.txt")
    rep = attncheck.diff(old, new, model=str(GPT2))
    doc = _same(rep.to_dict())
    assert doc == cli("diff", old, new, "--model", GPT2, "--json", "-").json()
    assert doc["reference"]["model"] == str(GPT2) and rep.exit_code == 0


@pytest.mark.parametrize("dump,model", [("gpt2-how-are.txt", None), ("gpt2-long.txt", GPT2),
                                        ("gpt2-flash-attn.txt", GPT2)])
def test_inspect_is_inspect(dump, model):
    path = str(FIXTURES / dump)
    seen = attncheck.inspect(path, 0, 0, model=None if model is None else str(model))
    args = ("inspect", path, "--layer", "0", "--head", "0", "--json", "-") + (("--model", model) if model else ())
    assert _same(seen.to_dict()) == cli(*args).json() and seen.exit_code == 0
    assert (seen.flash is not None) == (dump == "gpt2-flash-attn.txt")
    assert (seen.model is not None) == (model is not None)
    # the package is still the package once its modules are imported, and still callable
    assert attncheck.inspect.walk.span([1, 2, 3]) == "1..3"
    assert attncheck.inspect(path, 1, 11, model=None if model is None else str(model)).passed


def test_inspect_of_flash_attention_without_a_model_is_nothing_to_inspect():
    from attncheck.inspect.walk import NothingToInspect

    with pytest.raises(NothingToInspect, match="flash attention"):
        attncheck.inspect(str(FIXTURES / "gpt2-flash-attn.txt"), 0, 0)
    with pytest.raises(attncheck.DumpError, match="head 12 does not exist"):
        attncheck.inspect(str(HOW_ARE), 0, 12)


@pytest.mark.parametrize("model", [None, GPT2], ids=["ids", "text"])
def test_list_dump_is_lists_entry(model):
    listed = attncheck.list_dump(str(FIXTURES / "gpt2-ubatch2.txt"), model=None if model is None else str(model))
    args = ("list", FIXTURES / "gpt2-ubatch2.txt", "--json", "-") + (("--model", model) if model else ())
    assert _same(listed) == cli(*args).json()["dumps"][0]
    assert listed["evaluations"] == 3 and listed["runs"][0]["tokens"] == [40, 267, 269, 273, 285, 278]
    assert ("token_text" in listed["runs"][0]) == (model is not None)


def test_run_is_run(tmp_path):
    """llama.cpp is a stand-in printing a real dump (tests/standin.py says why)."""
    from standin import stand_in

    fake, args = stand_in(tmp_path, HOW_ARE)
    report = attncheck.run(str(GPT2), "How are", ["-ub", "2"], binary=str(fake), layers=frozenset({1}))
    assert args.read_text().split("\n")[:-1] == ["-m", str(GPT2), "-p", "How are", "-ub", "2", "--flash-attn", "off"]
    assert [s.layer for s in report.sites] == [1] and report.exit_code == 0
    assert report.totals()["model_kq_elements_checked"] == 72
    doc = cli("run", "-m", GPT2, "-p", "How are", "--bin", fake, "--layer", "1", "--json", "-", "--", "-ub", "2").json()
    assert _same(report.to_dict()) == doc
    with pytest.raises(attncheck.ModelError, match="no such file"):
        attncheck.run(str(tmp_path / "missing.gguf"), "How are", binary=str(fake))
    (tmp_path / "refused").mkdir()
    refused, _ = stand_in(tmp_path / "refused", FIXTURES / "refused" / "unknown-option.txt", code=1)
    with pytest.raises(attncheck.DumpError, match="it said: error: invalid argument: --junit"):
        attncheck.run(str(GPT2), "How are", ["--junit", "r.xml"], binary=str(refused))
