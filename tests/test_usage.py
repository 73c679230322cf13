"""What a newcomer types wrong, and what attncheck answers: one line naming the option or file, exit 2, before any
work; a head that is not there or was not printed named as such; several dumps kept apart in JSON and JUnit."""
from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from conftest import FIXTURES, attncheck as run
from dumpedit import DumpEdit

HOW_ARE = FIXTURES / "gpt2-how-are.txt"


def one_error_line(r, *words: str) -> str:
    """The run failed as a usage error: exit 2, nothing on stdout, one line on stderr holding each word."""
    assert r.code == 2, (r.code, r.err)
    assert r.out == ""
    (line,) = r.err.splitlines()
    assert line.startswith("attncheck: error: ") and all(w in line for w in words), line
    return line


@pytest.mark.parametrize("option", ["--json", "--junit", "--html"])
def test_an_output_in_a_missing_folder_is_refused_before_the_check(tmp_path, option):
    target = tmp_path / "no" / "x.out"
    line = one_error_line(run("check", HOW_ARE, option, target), option, str(target), "does not exist")
    assert line == f"attncheck: error: {option} {target}: the folder {tmp_path / 'no'} does not exist"


def test_every_command_checks_its_outputs_first(tmp_path):
    missing = tmp_path / "no" / "x"
    one_error_line(run("inspect", HOW_ARE, "--layer", "0", "--head", "0", "--json", missing), "--json")
    one_error_line(run("diff", HOW_ARE, HOW_ARE, "--junit", missing), "--junit")
    one_error_line(run("list", HOW_ARE, "--json", missing), "--json")
    # run: before llama.cpp is looked for (no binary is given here, and none would be found)
    one_error_line(run("run", "-m", FIXTURES / "models" / "gpt2-mini-q8_0.gguf", "-p", "x", "--bin",
                       tmp_path / "no-binary", "--keep", missing), "--keep", "does not exist")
    one_error_line(run("check", HOW_ARE, "--json", tmp_path), "is a folder")


@pytest.mark.parametrize("args, option", [
    (("check", HOW_ARE, "--atol", "-1"), "--atol"),
    (("check", HOW_ARE, "--rtol", "inf"), "--rtol"),
    (("check", HOW_ARE, "--kq-scale", "nan"), "--kq-scale"),
    (("check", HOW_ARE, "--kq-scale", "inf"), "--kq-scale"),
    (("check", HOW_ARE, "--kq-scale", "0"), "--kq-scale"),
    (("check", HOW_ARE, "--kq-scale", "-0.125"), "--kq-scale"),
    (("check", HOW_ARE, "--layer", "-1"), "--layer"),
    (("check", HOW_ARE, "--head", "-2"), "--head"),
    (("inspect", HOW_ARE, "--layer", "0", "--head", "0", "--query", "-1"), "query -1 does not exist: queries 0..1"),
    (("inspect", HOW_ARE, "--layer", "0", "--head", "0", "--kq-scale", "-1"), "--kq-scale"),
    (("diff", HOW_ARE, HOW_ARE, "--atol", "nan"), "--atol"),
    (("diff", HOW_ARE, HOW_ARE, "--rtol", "-1e-3"), "--rtol"),
])
def test_nonsense_numbers_are_one_line_usage_errors(args, option):
    one_error_line(run(*args), option)


def test_a_good_scale_is_still_taken():
    r = run("check", HOW_ARE, "--kq-scale", "0.125", "--atol", "1e-3", "--rtol", "0", "--json", "-")
    assert r.code == 0 and r.json()["kq_scale"] == {"value": 0.125, "origin": "option", "detail": "--kq-scale"}


def test_a_typo_for_a_command_names_the_commands():
    line = one_error_line(run("chek", HOW_ARE), "'chek'", "check, diff, help, inspect, list, run", "did you mean check?")
    assert "PASS" not in line
    one_error_line(run("no-such-dump.txt"), "'no-such-dump.txt'", "neither a command nor a file")
    assert run(HOW_ARE, "-q").code == 0  # a file first is still `check FILE`


def test_a_head_no_layer_has_is_a_usage_error():
    one_error_line(run("check", HOW_ARE, "--head", "99"), "--head 99", "heads 0..11")


def test_a_head_that_was_not_printed_is_named_with_those_that_were(tmp_path):
    junit = tmp_path / "j.xml"
    r = run("check", HOW_ARE, "--head", "3", "--junit", junit)
    assert r.code == 3
    assert ("UNVERIFIED fixtures" not in r.out and "head 3 was not printed: llama.cpp prints the first and last 3 "
            "heads, here 0, 1, 2, 9, 10, 11 of 0..11") in r.out.replace("\n", " ")
    assert "PASS" not in r.out  # rows of nothing are not passes
    cases = ET.parse(junit).getroot().iter("testcase")
    assert [c.find("skipped").get("message") for c in cases] == [
        "nothing checked: head 3 not printed (printed: 0, 1, 2, 9, 10, 11)"] * 2
    both = run("check", HOW_ARE, "--head", "3", "--head", "0", "--json", "-")
    assert both.code == 0 and both.json()["heads"] == {"asked": [0, 3], "not_printed": [3]}
    assert "attncheck: warning: --head 3: not printed in" in both.err


def test_a_layer_the_dump_does_not_have_is_a_usage_error():
    """--layer 7 of a 2-layer dump: one line naming the layers there, exit 2; a layer that is there but has no softmax
    attention (a hybrid's recurrent layer) is not absent: nothing to check, exit 3."""
    r = run("check", HOW_ARE, "--layer", "7")
    assert r.code == 2 and r.out == ""
    assert r.err.strip() == f"attncheck: error: --layer 7: no such layer in {HOW_ARE}: its layers are 0..1"
    assert run("check", HOW_ARE, "--layer", "1", "-q").code == 0
    hybrid = run("check", FIXTURES / "arch" / "qwen35-long.txt", "--layer", "0", "-q")
    assert hybrid.code == 3 and "the dump has layers 1, 3" in hybrid.out


def test_junit_for_unusable_input_holds_the_error_line(tmp_path):
    junit = tmp_path / "j.xml"
    missing = tmp_path / "missing.txt"
    r = run("check", HOW_ARE, missing, "--junit", junit, "-q")
    assert r.code == 2
    (error_line,) = [line for line in r.err.splitlines() if "missing.txt" in line]
    (error,) = ET.parse(junit).getroot().iter("error")
    assert error.get("message") == error.text == error_line.removeprefix("attncheck: error: ")
    assert error.text.startswith(f"{missing}: cannot read")


def test_fail_fast_with_two_dumps_says_it_stopped_and_keeps_the_multi_dump_form(tmp_path):
    edit = DumpEdit(HOW_ARE, tmp_path / "bad.txt")
    edit.add("kqv-0", (0, 1, 0), 0.05)
    bad = edit.save()
    r = run("check", bad, HOW_ARE, "--fail-fast", "--json", tmp_path / "o.json")
    assert r.code == 1
    assert f"stopped early (--fail-fast): 1 of 2 dumps not checked: {HOW_ARE}" in r.out
    import json

    doc = json.loads((tmp_path / "o.json").read_text())
    assert (doc["schema"], doc["verdict"], doc["exit_code"], doc["stopped_early"]) == (1, "fail", 1, True)
    assert doc["not_checked"] == [str(HOW_ARE)] and [d["source"] for d in doc["dumps"]] == [str(bad)]


def test_several_dumps_have_an_overall_verdict(tmp_path):
    doc = run("check", HOW_ARE, FIXTURES / "gpt2-kv-f32.txt", tmp_path / "missing.txt", "--json", "-").json()
    assert (doc["verdict"], doc["exit_code"], doc["stopped_early"], doc["not_checked"]) == ("error", 2, False, [])
    assert [d["verdict"] for d in doc["dumps"]] == ["pass", "pass"]
    assert [e["source"] for e in doc["errors"]] == [str(tmp_path / "missing.txt")]
