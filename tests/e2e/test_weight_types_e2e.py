"""End to end, every weight type: scripts/make_quant_models.py's random llama, quantized by llama.cpp's own
llama-quantize --pure into each type, run through llama-eval-callback and checked with `--model`. Each type converts
its activations differently before its dot products (model/matmul.py); layer 0 must hold to its derived bounds (print
precision, f32 summation noise, rare rounding flips), so an activation arithmetic that is not the type's fails here."""
from __future__ import annotations

import pytest
from gguf import GGUFReader
from pipeline import BIN, check_file, dump_file

pytestmark = pytest.mark.skipif(not BIN, reason="set LLAMA_EVAL_CALLBACK (make e2e builds and sets it)")

TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
         "IQ4_NL", "IQ4_XS"]
PROMPT = "The animal didn't cross the street because it was too tired, and I like to draw the cat on the mat."
PRINT = 5e-5


@pytest.mark.parametrize("qtype", TYPES)
def test_weight_type_passes_with_layer0_at_print_precision(qtype, quant_models, tmp_path):
    model = quant_models / f"llama-{qtype.lower()}.gguf"
    weights = {t.tensor_type.name for t in GGUFReader(str(model)).tensors if len(t.shape) >= 2}
    assert weights == {qtype}  # --pure: llama-quantize wrote every matrix in the type
    dump = dump_file(tmp_path / "dump.txt", model, PROMPT, "--flash-attn", "off")
    code, doc, err = check_file(dump, "--model", str(model))
    assert code == 0, err[-3000:]
    assert doc["model"]["first_failed"] is None
    layer0 = {c["node"]: c for s in doc["sites"] if s["layer"] == 0 for c in s["checks"]
              if c["check"] in ("model_q", "model_kcur", "model_vcur") and c["error_model"] == "derived"}
    assert layer0, "layer 0's projections were checked"
    # the projections carry no flip allowance: at print precision, up to f32 summation noise
    assert all(c["passed"] and c["max_error"] < 2 * PRINT for c in layer0.values()), {
        n: c["max_error"] for n, c in layer0.items()}
