"""With a model, token ids are shown with their text: check's table and JSON, inspect, list.

The shipped dumps ran the prompts "How are" and "I like to draw" (fixtures/MANIFEST.jsonl); their token ids read back
as those words through the model's vocabulary.
"""
from __future__ import annotations

import json

from attncheck.arch.gguf_header import read_header
from attncheck.arch.vocab import token_text
from conftest import FIXTURES, attncheck

GPT2 = FIXTURES / "models" / "gpt2-mini-q8_0.gguf"
LLAMA = FIXTURES / "models" / "llama-mini-gqa-f16.gguf"


def test_check_shows_the_prompt_as_text():
    r = attncheck("check", FIXTURES / "gpt2-how-are.txt", "--model", GPT2, "--json", "-")
    assert r.code == 0
    assert r.json()["token_text"] == [["How", " are"]]
    table = attncheck("check", FIXTURES / "gpt2-how-are.txt", "--model", GPT2)
    assert "257 'How'  260 ' are'" in table.out


def test_without_a_model_no_text():
    r = attncheck("check", FIXTURES / "gpt2-how-are.txt", "--json", "-")
    assert r.json()["token_text"] is None


def test_inspect_and_list_show_the_text():
    r = attncheck("inspect", FIXTURES / "llama-gqa-draw.txt", "--layer", "0", "--head", "0", "--model", LLAMA,
                  "--json", "-")
    assert "".join(r.json()["token_text"]) == "I like to draw"
    listed = attncheck("list", FIXTURES / "llama-gqa-draw.txt", "--model", LLAMA)
    assert listed.code == 0 and "' like'" in listed.out and "' draw'" in listed.out


def test_list_with_a_file_that_is_not_a_model():
    r = attncheck("list", FIXTURES / "gpt2-how-are.txt", "--model", FIXTURES / "gpt2-how-are.txt")
    assert r.code == 2 and r.out == ""
    assert r.err.startswith("attncheck: error: ") and "not a GGUF file" in r.err and "Traceback" not in r.err


def test_sentencepiece_and_byte_level_spellings():
    """SentencePiece writes a space as ▁ and lone bytes as <0xNN>; byte-level BPE maps bytes to printable characters
    (a space is Ġ, a newline Ċ)."""
    spm = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<s>", "▁Hello", "<0x0A>", "world"]}
    assert token_text(spm, [0, 1, 2, 3, 9]) == ["<s>", " Hello", "\n", "world", "<id 9?>"]
    bpe = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["ĠHello", "Ċ", "Ã©"]}
    assert token_text(bpe, [0, 1, 2]) == [" Hello", "\n", "é"]
    assert token_text({}, [1]) is None and token_text(spm, None) is None


def test_the_header_keeps_the_vocabulary():
    tokens = read_header(GPT2).meta["tokenizer.ggml.tokens"]
    assert len(tokens) == 381 and tokens[257] == "How"
    assert json.dumps(token_text(read_header(GPT2).meta, [260])) == '[" are"]'
