"""`attncheck run` takes every option of `check`, wherever it stands before `--`, and gives llama.cpp what follows
`--`, untouched (issue 28); an option it does not know, or a missing model, stops it before llama.cpp starts; when
llama.cpp refuses to run, its own error lines are the error (issue 28).

llama.cpp here is a stand-in (a shell script) that writes down the arguments it was given and prints a real dump or
a real refusal of llama.cpp's (fixtures/refused/): what is tested is what attncheck passes and how it reads the
answer, which the real binary would not record. tests/e2e/test_llama_cpp.py runs the real one.
"""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from conftest import FIXTURES, attncheck as run
from standin import stand_in

GPT2 = FIXTURES / "models" / "gpt2-mini-q8_0.gguf"
REFUSED = FIXTURES / "refused"
def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("attncheck: error:")]


@pytest.mark.parametrize("order", ["ours-first", "ours-after-the-model", "mixed"])
def test_run_takes_checks_options_anywhere_and_passes_the_rest_to_llama_cpp(order, tmp_path):
    fake, args = stand_in(tmp_path, FIXTURES / "gpt2-how-are.txt")
    junit = tmp_path / "r.xml"
    ours = ["--junit", junit, "-v", "--layer", "0", "--json", "-", "--head", "2", "--atol", "0.001", "-j", "1"]
    model = ["-m", GPT2, "-p", "How are", "--bin", fake]
    argv = {"ours-first": [*ours, *model], "ours-after-the-model": [*model, *ours],
            "mixed": [*ours[:5], *model[:2], *ours[5:], *model[2:]]}[order]
    r = run("run", *argv, "--", "-ub", "2", "-v", "--json", "x")
    assert r.code == 0, r.err
    # llama.cpp got its own arguments, and those after `--` only, -v and --json included
    assert args.read_text().split("\n")[:-1] == ["-m", str(GPT2), "-p", "How are", "-ub", "2", "-v", "--json", "x",
                                                 "--flash-attn", "off"]
    doc = json.loads(r.out)
    assert [s["layer"] for s in doc["sites"]] == [0] and doc["heads"]["asked"] == [2]
    assert doc["tolerance"]["origin"] == "--atol/--rtol"
    assert " PASS pv kqv-0 " in r.err  # -v: every check of every site, on the table's stream (stderr: --json -)
    assert ET.parse(junit).getroot().get("tests") == "1"
    assert f"attncheck: wrote {junit} (" in r.err


def test_run_has_every_option_of_check():
    from attncheck.cli.check import check
    from attncheck.cli.run import run as run_command

    def opts(command):
        return {o for p in command.params for o in getattr(p, "opts", ()) if o.startswith("-")}

    assert opts(check) - {"--model"} <= opts(run_command)


@pytest.mark.parametrize("unknown,said", [("--jsn", "--jsn (did you mean --json?)"), ("-ub", "-ub"),
                                          ("-ctv", "-ctv")])
def test_an_option_attncheck_does_not_know_is_an_error_before_llama_cpp_starts(unknown, said, tmp_path):
    fake, _ = stand_in(tmp_path, FIXTURES / "gpt2-how-are.txt")
    r = run("run", "-m", GPT2, "-p", "How are", "--bin", fake, unknown, "x")
    assert r.code == 2 and r.out == ""
    assert _error_lines(r.err) == r.err.splitlines()
    line, = _error_lines(r.err)
    assert f"no such option: {said}" in line and "llama.cpp's options go after `--`" in line
    assert not (tmp_path / "starts").exists()


def test_run_of_a_missing_model_is_exit_2_and_starts_nothing(tmp_path):
    fake, _ = stand_in(tmp_path, FIXTURES / "gpt2-how-are.txt")
    r = run("run", "-m", tmp_path / "missing.gguf", "-p", "How are", "--bin", fake)
    assert r.code == 2 and r.err == f"attncheck: error: -m {tmp_path / 'missing.gguf'}: no such file\n"
    assert not (tmp_path / "starts").exists()  # not even `--help`, which tells the flash-attention syntax


@pytest.mark.parametrize("log,said", [
    ("unknown-option.txt", "it said: error: invalid argument: --junit"),
    # 2024's build prints its error line first, then 282 lines of usage: the line is found at the head
    ("old-unknown-option.txt", "it said: error: unknown argument: --junit"),
    ("ctv-q8_0-without-flash-attn.txt",
     "it said: E llama_init_from_model: quantized V cache requires flash_attn to be enabled | "),
])
def test_llama_cpp_refusing_to_run_is_one_line_with_its_own_words(log, said, tmp_path):
    fake, _ = stand_in(tmp_path, REFUSED / log, code=1)
    r = run("run", "-m", GPT2, "-p", "How are", "--bin", fake, "--", "--junit", "r.xml")
    assert r.code == 2 and r.out == ""
    line, = r.err.splitlines()
    assert line.startswith("attncheck: error: llama-eval-callback: exited with code 1; ") and said in line
    assert "\\n" not in line


@pytest.mark.parametrize("log,at,said", [
    ("ctv-q8_0-without-flash-attn.txt", 1,
     ["E llama_init_from_model: quantized V cache requires flash_attn to be enabled",
      "E common_fit_params: encountered an error while trying to fit params to free device memory: failed to create "
      "llama_context from model",
      "E cmn  common_init_: failed to create context with model 'fixtures/models/gpt2-mini-q8_0.gguf'",
      "E main : failed to init"]),
    ("old-ctv-q8_0-without-flash-attn.txt", 81,
     ["llama_new_context_with_model: V cache quantization requires flash_attn",
      "llama_init_from_gpt_params: error: failed to create context with model "
      "'fixtures/models/llama-mini-gqa-f16.gguf'",
      "main : failed to init"]),
])
def test_a_log_without_a_tensor_dump_says_what_llama_cpp_said(log, at, said):
    r = run("check", REFUSED / log)
    assert r.code == 2 and r.out == ""
    assert r.err == (f"attncheck: error: {REFUSED / log}:{at}: no tensor dump: llama.cpp stopped before computing; "
                     f"it said: {' | '.join(said)}\n")


def test_a_log_of_something_else_still_says_how_to_make_a_dump():
    r = run("check", FIXTURES / "MANIFEST.jsonl")
    assert r.code == 2 and "no tensor dump found" in r.err and "it said" not in r.err
