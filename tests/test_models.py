"""The default tokenizer and model: built in code, round-trip through save/load, the chat
format, caching of the warm-started model."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
import torch

from pipeline.errors import ConfigError
from pipeline.models import BUILD_INFO, ModelConfig, count_parameters, default_cache_dir, encode_prompt, load_model, load_tokenizer, weights_hash
from pipeline.workflows.math.warmstart import WarmStartConfig
from pipeline.workflows.math.model import build_default_model
from pipeline.workflows.math.model import build_tokenizer
from pipeline.models.sft import encode_messages_fast
from pipeline.workflows.math.warmstart import sft_examples
from pipeline.tasks import ArithmeticTask
from pipeline.tasks.prompts import ARITHMETIC_PROMPTS, PromptTemplate

# the arithmetic prompts with a Verifier shown the proposal (the default one works blind)
_SIGHTED = replace(ARITHMETIC_PROMPTS, verifier_user=PromptTemplate().verifier_user)


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def test_tokenizer_round_trip_gives_the_same_ids(tiny_model_dir, tok):
    fresh = build_tokenizer(ModelConfig(seed=1234))
    texts = ["123+45=", "Hint: the tens digit is 6", "That is wrong. Try again.", "héllo wörld 3.14 ✓", "\n  x"]
    for t in texts:
        assert tok(t, add_special_tokens=False)["input_ids"] == fresh(t, add_special_tokens=False)["input_ids"]
        assert tok.decode(tok(t, add_special_tokens=False)["input_ids"]) == t
    assert tok.chat_template == fresh.chat_template
    assert tok.get_vocab() == fresh.get_vocab()


def test_vocab_has_merges_and_digits_are_single_tokens(tok):
    vocab = tok.get_vocab()
    assert 300 <= len(tok) <= 400
    assert len(vocab) > 256 + 5  # merges exist beyond bytes + specials
    assert all(len(t) == 1 for t in vocab if re.search(r"\d", t) and not t.startswith("<|")), "a token joins digits"
    assert tok.tokenize("1234567890") == list("1234567890")
    ids = tok("x 907+18=925", add_special_tokens=False)["input_ids"]
    digit_tokens = [tok.convert_ids_to_tokens(i) for i in ids if re.search(r"\d", tok.convert_ids_to_tokens(i))]
    assert digit_tokens == list("90718925")


def test_chat_template_role_markers_and_eos(tok):
    msgs = [{"role": "system", "content": "Hint: 16_"}, {"role": "user", "content": "123+45="}]
    prompt = encode_prompt(tok, msgs)
    assert tok.decode(prompt) == "<|system|>Hint: 16_<|end|><|user|>123+45=<|end|><|assistant|>"
    full = tok.apply_chat_template([*msgs, {"role": "assistant", "content": "168"}], tokenize=True, return_dict=False)
    assert list(full) == prompt + tok("168", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert tok.eos_token == "<|end|>" and tok.pad_token == "<|pad|>" and tok.pad_token_id != tok.eos_token_id
    assert tok.padding_side == "left"
    # the fast encoder of the warm start renders exactly what the chat template renders
    task = ArithmeticTask()
    examples = sft_examples(task, __import__("random").Random(5), 40, WarmStartConfig())
    for (m, target), (p, c) in zip(examples, encode_messages_fast(tok, examples)):
        assert encode_prompt(tok, m) == p
        assert list(tok.apply_chat_template([*m, {"role": "assistant", "content": target}], tokenize=True, return_dict=False)) == p[:-1] + [p[-1], *c]


def test_model_round_trip_same_logits_and_size(tiny_model_dir, tmp_path):
    model = load_model(tiny_model_dir)
    assert 1_000_000 <= count_parameters(model) <= 4_000_000
    assert all(p.dtype == torch.float32 for p in model.parameters())
    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    assert cfg["model_type"] == "llama"
    gen = json.loads((tiny_model_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 1 and gen["pad_token_id"] == 0
    assert (tiny_model_dir / "model.safetensors").is_file()
    ids = torch.tensor([[3, 21, 22, 15, 23, 33, 1, 4]])
    with torch.no_grad():
        before = model(ids).logits
    model.save_pretrained(tmp_path / "copy")
    load_tokenizer(tiny_model_dir).save_pretrained(tmp_path / "copy")
    with torch.no_grad():
        after = load_model(tmp_path / "copy")(ids).logits
    assert torch.equal(before, after)
    assert weights_hash(tmp_path / "copy") == weights_hash(tiny_model_dir)
    with torch.no_grad():
        model.model.embed_tokens.weight[5, 0] += 1.0
    model.save_pretrained(tmp_path / "changed")
    assert weights_hash(tmp_path / "changed") != weights_hash(tiny_model_dir)


def test_the_untrained_model_is_deterministic_from_its_seed(tiny_model_dir, tmp_path):
    from pipeline.models.build import build_untrained_model

    cfg = ModelConfig(seed=1234)
    again = build_untrained_model(cfg, build_tokenizer(cfg), tmp_path / "again")
    assert weights_hash(again) == weights_hash(tiny_model_dir)


def test_the_initial_weights_spread_as_the_config_says_and_only_a_changed_spread_enters_the_key(tmp_path):
    from pipeline.models.build import build_untrained_model

    def spread(range_: float) -> float:
        folder = build_untrained_model(ModelConfig(seed=7, initializer_range=range_), build_tokenizer(ModelConfig()), tmp_path / str(range_))
        return float(load_model(folder).model.layers[0].mlp.up_proj.weight.std())

    assert spread(0.02) == pytest.approx(0.02, rel=0.05) and spread(0.1) == pytest.approx(0.1, rel=0.05)
    assert "initializer_range" not in ModelConfig().key()  # the builds made before it keep their keys
    assert ModelConfig(initializer_range=0.1).key()["initializer_range"] == 0.1
    with pytest.raises(ConfigError, match="initializer_range"):
        ModelConfig(initializer_range=0.0)


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="num_heads"):
        ModelConfig(hidden_size=100, num_heads=3)
    with pytest.raises(ConfigError, match="target_accuracy"):
        WarmStartConfig(target_accuracy=0)
    with pytest.raises(ConfigError, match="config.json"):
        load_model("/nonexistent/model")


def test_default_cache_dir_is_the_projects_one_cache_folder(monkeypatch, tmp_path):
    """Built models live in the cache folder of `pipeline.store.cache_root` (one rule, one place),
    which MAXIT_CACHE_DIR names when set."""
    from pipeline.store import cache_root

    monkeypatch.setenv("MAXIT_CACHE_DIR", str(tmp_path / "c"))
    assert default_cache_dir() == (tmp_path / "c").resolve() == cache_root()
    monkeypatch.delenv("MAXIT_CACHE_DIR")
    monkeypatch.chdir(tmp_path)
    assert default_cache_dir() == cache_root()


def test_an_sft_step_trains_on_the_mean_token_cross_entropy_of_its_batch(tiny_model_dir, tok):
    """`sft_step` returns the batch's mean cross-entropy over its completion tokens (EOS included),
    whatever the two length buckets it runs as, and moves the weights; `sft_steps` yields each
    step's loss on `examples(step)`, step numbers from 1."""
    from pipeline.models.sft import FastEncoder, batch_tensors, sft_step, sft_steps

    model = load_model(tiny_model_dir)
    task = ArithmeticTask()
    examples = [(task.solver_messages(p), p.answer) for p in task.problems("train", 6, seed=3)]
    examples.append((task.verifier_messages(task.problems("train", 1, seed=4)[0], "12"), "12 no"))  # a longer prompt
    pairs = FastEncoder(tok).encode(examples)
    ids, labels = batch_tensors(pairs, tok.pad_token_id)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, :-1]
        expected = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100).item()
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    assert sft_step(model, optimizer, pairs, tok.pad_token_id) == pytest.approx(expected, rel=1e-5)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    asked: list[int] = []
    losses = [loss for _, loss in sft_steps(model, tok, lambda step: asked.append(step) or examples, steps=3, lr=1e-3, lr_lambda=lambda s: 1.0)]
    assert asked == [1, 2, 3] and len(losses) == 3 and losses[-1] < losses[0] and model.training


def test_the_warm_starts_schedule_rises_then_falls_to_its_final_rate():
    from pipeline.models.sft import warmup_cosine

    lr_at = warmup_cosine(20, 500, 0.5)  # the tic-tac-toe build's: 20 warm-up steps, 1e-3 -> 5e-4
    assert lr_at(0) == pytest.approx(1 / 20) and lr_at(19) == pytest.approx(1.0) and lr_at(20) == pytest.approx(1.0)
    assert lr_at(260) == pytest.approx(0.75) and lr_at(500) == pytest.approx(0.5) and lr_at(900) == pytest.approx(0.5)
    assert all(lr_at(s) >= lr_at(s + 1) for s in range(20, 600))


def test_sampling_for_a_measurement_is_seeded_and_leaves_the_callers_state(tiny_model_dir, tok):
    """`generate_texts` under `seeded_sampling` gives the same completions for the same seed (and
    others for another), and leaves torch's random state and the model's mode as they were."""
    from pipeline.models.sft import FastEncoder, generate_texts, seeded_sampling

    model = load_model(tiny_model_dir).train()
    task = ArithmeticTask()
    prompts = [p for p, _ in FastEncoder(tok).encode([(task.solver_messages(p), "") for p in task.problems("train", 5, seed=1)])]
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    runs = []
    for seed in (7, 7, 8):
        with seeded_sampling(model, seed):
            assert not model.training
            runs.append(generate_texts(model, tok, prompts, 1.0, 6, batch_size=2))
    assert model.training and torch.equal(torch.random.get_rng_state(), state)
    assert runs[0] == runs[1] and runs[0] != runs[2] and len(runs[0]) == 5


def test_default_model_is_cached_and_warm_started(default_model_dir, monkeypatch):
    import pipeline.workflows.math.model as models

    info = json.loads((default_model_dir / BUILD_INFO).read_text())
    # left room to improve, but is sometimes right (held-out, T=1, no hint)
    assert 0.10 <= info["heldout_acc_t1"] <= 0.60, info
    assert 0.10 <= info["heldout_acc_t1_hint"] <= 0.70, info  # with the hint: measured, and in range too

    def no_training(*args, **kwargs):
        raise AssertionError("the cached build was trained again")

    monkeypatch.setattr(models, "warm_start", no_training)
    assert build_default_model(default_model_dir.parent.parent, seed=0) == default_model_dir  # reused, not rebuilt
    monkeypatch.undo()
    tok, model = load_tokenizer(default_model_dir), load_model(default_model_dir)
    # it learned the formats: the Solver answers with a number, the (blind) Verifier with the sum it
    # works out (its verdict is read by comparing that sum with the proposal), then EOS
    task = ArithmeticTask()
    p = task.problems("heldout", 1, 0)[0]
    for msgs, form in ((task.verifier_messages(p, p.answer), r"\d+"), (task.solver_messages(p), r"\d+")):
        ids = torch.tensor([encode_prompt(tok, msgs)])
        out = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)[0, ids.shape[1]:].tolist()
        assert out[-1] == tok.eos_token_id
        text = tok.decode(out, skip_special_tokens=True)
        assert re.fullmatch(form, text), text


def test_cache_key_follows_the_settings(tmp_path, monkeypatch):
    from pipeline.workflows.math.model import _build_key

    base = _build_key(ModelConfig(), WarmStartConfig())
    assert base == _build_key(ModelConfig(), WarmStartConfig(threads=2))
    assert base != _build_key(ModelConfig(seed=1), WarmStartConfig())
    assert base != _build_key(ModelConfig(), WarmStartConfig(lr=1e-3))
    # the texts the warm start trains on are part of the key; how a verdict is read is not
    from dataclasses import replace

    import pipeline.tasks.prompts as prompts

    arithmetic = prompts.ARITHMETIC_PROMPTS
    monkeypatch.setattr(prompts, "ARITHMETIC_PROMPTS", replace(arithmetic, verifier_user="{question} {solution}?"))
    assert base != _build_key(ModelConfig(), WarmStartConfig())
    monkeypatch.setattr(prompts, "ARITHMETIC_PROMPTS", _SIGHTED)
    sighted = _build_key(ModelConfig(), WarmStartConfig())
    assert sighted != base  # a Verifier shown the proposal is another model
    monkeypatch.setattr(prompts, "ARITHMETIC_PROMPTS", replace(_SIGHTED, verdict="first_word"))
    assert sighted == _build_key(ModelConfig(), WarmStartConfig())


def test_the_verifier_is_taught_to_work_the_answer_out_then_judge():
    import random

    from pipeline.tasks.base import parse_verdict

    task = ArithmeticTask(prompts=_SIGHTED)  # a Verifier shown the proposal (the default is blind)
    examples = sft_examples(task, random.Random(7), 400, WarmStartConfig(mix_verifier=1.0, mix_hint=0.0, mix_feedback=0.0, mix_plain=1e-9, verifier_target="answer_verdict"))
    verifier = [(m, t) for m, t in examples if "Proposed answer" in m[-1]["content"]]
    assert len(verifier) > 300
    for messages, target in verifier:
        question = messages[-1]["content"].split("\n")[0]
        a, b = (int(x) for x in question.rstrip("=").split("+"))
        answer, verdict = target.split(" ")
        assert int(answer) == a + b  # the right answer first
        proposed = messages[-1]["content"].split("Proposed answer: ")[1].split("\n")[0]
        assert parse_verdict(target) is (int(proposed) == a + b)  # then the verdict, which the parser reads
    assert WarmStartConfig().verifier_target == "answer_verdict"  # the default, checked above
    # "answer": the right answer alone (the arithmetic task would compare it with the proposal)
    default = sft_examples(task, random.Random(7), 400, WarmStartConfig(mix_verifier=1.0, mix_hint=0.0, mix_feedback=0.0, mix_plain=1e-9, verifier_target="answer"))
    verifier = [(m, t) for m, t in default if "Proposed answer" in m[-1]["content"]]
    assert len(verifier) > 300
    proposals = []
    for messages, target in verifier:
        a, b = (int(x) for x in messages[-1]["content"].split("\n")[0].rstrip("=").split("+"))
        assert target == str(a + b)
        proposed = messages[-1]["content"].split("Proposed answer: ")[1].split("\n")[0]
        proposals.append(int(proposed) == a + b)
        assert task.parse_verdict(target, proposed) is (int(proposed) == a + b)
    assert 0.4 < sum(proposals) / len(proposals) < 0.6  # half right, half near misses
    plain = sft_examples(task, random.Random(7), 400, WarmStartConfig(mix_verifier=1.0, mix_plain=1e-9, mix_hint=0.0, mix_feedback=0.0, verifier_target="verdict"))
    assert {t for m, t in plain if "Proposed answer" in m[-1]["content"]} == {"yes", "no"}
    with pytest.raises(ConfigError, match="verifier_target"):
        WarmStartConfig(verifier_target="answers")


def test_a_blind_verifier_is_taught_the_answer_alone():
    import random

    task = ArithmeticTask()  # the default Verifier is blind: it is not shown the proposal
    assert not task.prompts.verifier_sees_solution
    examples = sft_examples(task, random.Random(7), 200, WarmStartConfig(mix_verifier=1.0, mix_hint=0.0, mix_feedback=0.0, mix_plain=1e-9))
    verifier = [(m, t) for m, t in examples if "Check it" in m[-1]["content"]]
    assert len(verifier) > 150
    for messages, target in verifier:
        assert "Proposed" not in messages[-1]["content"]
        a, b = (int(x) for x in messages[-1]["content"].split("\n")[0].rstrip("=").split("+"))
        assert target == str(a + b)  # no verdict word: it cannot know the proposal


def test_verifier_right_share_sets_the_share_of_right_proposals():
    import random

    task = ArithmeticTask(prompts=_SIGHTED)
    for share, low, high in ((0.2, 0.12, 0.28), (0.5, 0.4, 0.6)):
        examples = sft_examples(
            task, random.Random(3), 600, WarmStartConfig(mix_verifier=1.0, mix_plain=1e-9, mix_hint=0.0, mix_feedback=0.0, verifier_right_share=share)
        )
        verdicts = [t.split(" ")[1] for m, t in examples if "Proposed answer" in m[-1]["content"]]
        assert low < verdicts.count("yes") / len(verdicts) < high, share
    with pytest.raises(ConfigError, match="verifier_right_share"):
        WarmStartConfig(verifier_right_share=1.5)


def test_the_warm_start_reports_its_progress_before_its_first_accuracy_probe(tiny_model_dir):
    """A line every `probe_every` steps before `min_steps` (loss and time, no probe), then the
    probed lines: a slow machine shows it is alive long before the first probe."""
    from pipeline.workflows.math.warmstart import warm_start

    lines: list[str] = []
    config = WarmStartConfig(max_steps=6, min_steps=4, probe_every=2, probe_size=2, batch_size=4, warmup_steps=1)
    warm_start(load_model(tiny_model_dir), load_tokenizer(tiny_model_dir), config, log=lines.append)
    steps = [int(re.search(r"step\s+(\d+)/6", line).group(1)) for line in lines]
    assert steps == [2, 4, 6]
    assert "(accuracy probes from step 4)" in lines[0] and "acc (train probe)" not in lines[0]
    assert all("acc (train probe)" in line for line in lines[1:])
