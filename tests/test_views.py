"""Training views: the context swap (the expert-iteration plan's first test), identity reuse, turn-wise transforms,
non-prefix contexts, drops that are counted, and bad input named by column and step_id."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import ClassVar

import polars as pl
import pyarrow as pa
import pytest
import torch

from pipeline.errors import ConfigError, DataError
from pipeline.models.chat import encode_prompt
from pipeline.strategies import IID, Feedback, PromptAug, Strategy
from pipeline.learn.trainer import collate
from pipeline.learn.view_weights import balance_weights
from pipeline.learn.views import STATS_METADATA_KEY, build_training_view, to_dataset, view_hash
from pipeline.config import ViewConfig
from schemas import SchemaError, validate
from tiny import advantage_row, advantages_table, tiny_tokenizer


class IntTokenizer:
    """Fake tokenizer: a message's content is space-separated token ids; the "template"
    concatenates them (so a context of ids [1, 2, 3] is the message "1 2 3")."""

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True, return_dict=False):
        return [int(x) for m in messages for x in m["content"].split()]


@dataclass(frozen=True)
class SwapTo99(Strategy):
    """Trains every completion under the context [9, 9]."""

    strategy_id: ClassVar[str] = "swap"

    def training_messages(self, sampling_messages, turn, agent_id):
        return [{"role": "user", "content": "9 9"}]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def test_context_swap_seed004_view_row_and_collated_batch():
    adv = advantages_table(
        [
            advantage_row(
                "s0",
                strategy="swap",
                sampling_messages=[{"role": "user", "content": "1 2 3"}],
                prompt_ids=[1, 2, 3],
                completion_ids=[4, 5],
                completion_logprobs=[-0.1, -0.2],
            )
        ]
    )
    view, _ = build_training_view(adv, {"swap": SwapTo99()}, IntTokenizer())
    validate(view, "training_view")
    row = view.to_pylist()[0]
    assert row["train_prompt_ids"] == [9, 9]
    assert row["completion_ids"] == [4, 5]
    assert row["sampling_logprobs"] == pytest.approx([-0.1, -0.2], abs=1e-7)
    assert row["context_swapped"] is True

    # the same row as the trainer batches it
    batch = collate(to_dataset(view).to_list())
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    loss_mask = torch.cat([torch.zeros_like(batch["prompt_mask"], dtype=torch.float32), batch["completion_mask"]], dim=1)
    assert input_ids[0, :2].tolist() == [9, 9]
    assert input_ids[0].tolist() == [9, 9, 4, 5]
    assert loss_mask[0].tolist() == [0.0, 0.0, 1.0, 1.0]
    assert batch["sampling_logprobs"][0].tolist() == pytest.approx([-0.1, -0.2], abs=1e-7)


def test_identity_reuses_stored_prompt_ids_and_rerender_matches(tok):
    msgs = [{"role": "user", "content": "12+30="}]
    ids = encode_prompt(tok, msgs)
    adv = advantages_table([advantage_row("a", sampling_messages=msgs, prompt_ids=ids)])
    view, stats = build_training_view(adv, {"iid": IID()}, tok, ViewConfig(check_identity_render=True))
    assert view.column("train_prompt_ids").to_pylist() == [ids]
    assert encode_prompt(tok, IID().training_messages(msgs, 0, "solver")) == ids
    assert stats.n_rerendered == 0 and stats.n_context_swapped == 0
    assert view.column("context_swapped").to_pylist() == [False]


def test_identity_does_not_rerender_and_check_catches_foreign_template(tok):
    msgs = [{"role": "user", "content": "12+30="}]
    stored = [7, 7, 7]  # not what this tokenizer renders: proves the stored ids are the ones used
    adv = advantages_table([advantage_row("odd", sampling_messages=msgs, prompt_ids=stored)])
    view, _ = build_training_view(adv, {"iid": IID()}, tok)
    assert view.column("train_prompt_ids").to_pylist() == [stored]
    with pytest.raises(DataError, match="'odd'"):
        build_training_view(adv, {"iid": IID()}, tok, ViewConfig(check_identity_render=True))


def test_prompt_aug_training_context_is_not_a_prefix(tok):
    sampling = [{"role": "system", "content": "Hint: carry the one"}, {"role": "user", "content": "19+3="}]
    ids = encode_prompt(tok, sampling)
    adv = advantages_table([advantage_row("h", strategy="prompt_aug", sampling_messages=sampling, prompt_ids=ids)])
    view, _ = build_training_view(adv, {"prompt_aug": PromptAug()}, tok)
    train = view.column("train_prompt_ids").to_pylist()[0]
    assert train == encode_prompt(tok, [{"role": "user", "content": "19+3="}])
    assert train != ids[: len(train)]  # not a prefix of the sampling prompt
    assert view.column("completion_ids").to_pylist()[0] == [6, 7]
    assert view.column("context_swapped").to_pylist() == [True]


@pytest.mark.parametrize("train_context", ["problem", "attempt"])
def test_feedback_swaps_the_final_solver_turn_only(tok, train_context):
    problem = {"role": "user", "content": "5+5="}
    attempt = {"role": "assistant", "content": "11"}
    feedback = {"role": "user", "content": "Wrong, try again."}
    t0 = [problem]
    t1 = [problem, attempt, feedback]
    rows = [
        advantage_row("a1", strategy="feedback", turn=0, sampling_messages=t0, prompt_ids=encode_prompt(tok, t0)),
        advantage_row("a2", strategy="feedback", turn=1, sampling_messages=t1, prompt_ids=encode_prompt(tok, t1)),
        advantage_row("v", strategy="feedback", turn=1, agent_id="verifier", sampling_messages=t1, prompt_ids=encode_prompt(tok, t1)),
    ]
    view, _ = build_training_view(advantages_table(rows), {"feedback": Feedback(train_context=train_context)}, tok)
    got = dict(zip(view.column("step_id").to_pylist(), view.column("train_prompt_ids").to_pylist()))
    expected_a2 = encode_prompt(tok, [problem] if train_context == "problem" else [problem, attempt])
    assert got["a2"] == expected_a2
    assert got["a1"] == encode_prompt(tok, t0)
    assert got["v"] == encode_prompt(tok, t1)
    swapped = dict(zip(view.column("step_id").to_pylist(), view.column("context_swapped").to_pylist()))
    assert swapped == {"a1": False, "a2": True, "v": False}

    skip_view, stats = build_training_view(advantages_table(rows), {"feedback": Feedback(first_attempt="skip")}, tok)
    assert skip_view.column("step_id").to_pylist() == ["a2", "v"]
    assert stats.n_not_trainable == 1


def test_dropped_rows_are_counted_never_truncated(tok):
    rows = [
        advantage_row("keep"),
        advantage_row("inactive", active=False),
        advantage_row("noreward", reward=None),
        advantage_row("other", policy_id="verifier"),
        advantage_row("w0", sample_weight=0.0),
        advantage_row("a0", advantage=0.0),
        advantage_row("long", completion_ids=list(range(10, 30)), completion_logprobs=[-1.0] * 20),
    ]
    adv = advantages_table(rows)
    view, stats = build_training_view(adv, {"iid": IID()}, tok, ViewConfig(max_length=10, policy_ids=("shared",)))
    assert view.column("step_id").to_pylist() == ["keep"]
    assert (stats.n_input, stats.n_rows) == (7, 1)
    assert (stats.n_inactive, stats.n_null_reward, stats.n_other_policy) == (1, 1, 1)
    assert (stats.n_zero_weight, stats.n_zero_advantage, stats.n_too_long) == (1, 1, 1)
    assert json.loads(view.schema.metadata[STATS_METADATA_KEY]) == dataclasses.asdict(stats)
    # zero advantages kept on request (the rs loss wants them); nothing is ever cut short
    view2, _ = build_training_view(adv, {"iid": IID()}, tok, ViewConfig(drop_zero_advantage=False))
    assert set(view2.column("step_id").to_pylist()) == {"keep", "other", "a0", "long"}
    lengths = dict(zip(view2.column("step_id").to_pylist(), view2.column("completion_ids").to_pylist()))
    assert len(lengths["long"]) == 20


def test_missing_column_is_named(tok):
    adv = advantages_table([advantage_row("x")]).drop_columns(["completion_logprobs"])
    with pytest.raises(SchemaError, match="completion_logprobs"):
        build_training_view(adv, {"iid": IID()}, tok)


def test_length_mismatch_names_columns_and_step_id(tok):
    adv = advantages_table([advantage_row("ok"), advantage_row("bad-7", completion_ids=[1, 2, 3], completion_logprobs=[-0.1])])
    with pytest.raises(DataError, match=r"'completion_ids'.*'completion_logprobs'.*'bad-7'"):
        build_training_view(adv, {"iid": IID()}, tok)


def test_nan_values_and_unknown_strategies_are_named(tok):
    adv = advantages_table([advantage_row("ok"), advantage_row("nan-adv", advantage=float("nan"))])
    with pytest.raises(DataError, match=r"'advantage'.*'nan-adv'"):
        build_training_view(adv, {"iid": IID()}, tok)
    adv = advantages_table([advantage_row("nan-lp", completion_logprobs=[-0.1, float("nan")])])
    with pytest.raises(DataError, match=r"'completion_logprobs'.*'nan-lp'"):
        build_training_view(adv, {"iid": IID()}, tok)
    adv = advantages_table([advantage_row("t", strategy="tree")])
    with pytest.raises(ConfigError, match=r"'tree'.*'t'"):
        build_training_view(adv, {"iid": IID()}, tok)


def test_polars_input_and_dataset_share_the_arrow_data(tok):
    adv = pl.from_arrow(advantages_table([advantage_row(f"r{i}", advantage=float(i + 1)) for i in range(3)]))
    view, _ = build_training_view(adv.lazy(), {"iid": IID()}, tok)
    ds = to_dataset(view)
    assert ds.num_rows == 3
    assert ds[1]["step_id"] == "r1" and ds[1]["completion_ids"] == [6, 7]
    assert ds.data.table.column("advantage").to_pylist() == [1.0, 2.0, 3.0]


def test_view_hash_ignores_row_order_and_sees_content(tok):
    adv = advantages_table([advantage_row(f"r{i}", advantage=float(i + 1)) for i in range(3)])
    view, _ = build_training_view(adv, {"iid": IID()}, tok)
    shuffled = view.take(pa.array([2, 0, 1]))
    assert view_hash(view) == view_hash(shuffled)
    changed, _ = build_training_view(
        advantages_table([advantage_row(f"r{i}", advantage=float(i + 1), completion_logprobs=[-0.5, -0.3]) for i in range(3)]),
        {"iid": IID()},
        tok,
    )
    assert view_hash(changed) != view_hash(view)



def test_min_reward_drops_and_counts_rows_below_it(tok):
    rows = [advantage_row(f"s{i}", reward=r, advantage=0.0) for i, r in enumerate([1.0, 0.0, 2.0, None])]
    view, stats = build_training_view(
        advantages_table(rows), {"iid": IID()}, tok, ViewConfig(drop_zero_advantage=False, min_reward=1.0)
    )
    assert view.column("step_id").to_pylist() == ["s0", "s2"]
    assert (stats.n_below_min_reward, stats.n_null_reward, stats.n_rows) == (1, 1, 2)


def test_balance_weights_equalizes_class_totals_and_keeps_the_rest():
    view = pa.table(
        {
            "step_id": [f"s{i}" for i in range(6)],
            "sample_weight": [1.0, 1.0, 1.0, 2.0, 1.0, 0.5],
        }
    )
    # three "no" rows (total 3), one "yes" row (total 2), two unlabelled rows (e.g. Solver rows)
    labels = [False, False, False, True, None, None]
    out, info = balance_weights(view, labels)
    w = out.column("sample_weight").to_pylist()
    assert sum(w[:3]) == pytest.approx(2.5) and w[3] == pytest.approx(2.5)  # each class 5 / 2
    assert w[0] == w[1] == w[2]  # scaled alike inside a class
    assert w[4:] == [1.0, 0.5]  # unlabelled rows untouched
    assert sum(w[:4]) == pytest.approx(5.0)  # labelled total kept
    assert info[False] == (3, pytest.approx(2.5 / 3)) and info[True] == (1, pytest.approx(1.25))
    # one class only: nothing to balance
    same, _ = balance_weights(view, [True, True, None, None, None, None])
    assert same.column("sample_weight").to_pylist() == view.column("sample_weight").to_pylist()
    with pytest.raises(DataError, match="2 labels for 6 view rows"):
        balance_weights(view, [True, False])


def test_strategy_weights_count_each_policys_training_rows(tok):
    """n_s is counted over the rows each policy trains on, after the view's filters: the
    verifier's rows and the skipped first attempts do not shift the Solver's strategy mix."""
    rows = [advantage_row(f"i{k}", strategy="iid", policy_id="solver") for k in range(2)]
    second = [{"role": "user", "content": "1+2="}, {"role": "assistant", "content": "4"}, {"role": "user", "content": "Wrong."}]
    rows += [advantage_row(f"f{k}", strategy="feedback", turn=1, policy_id="solver", sampling_messages=second) for k in range(2)]
    rows += [advantage_row(f"f0-{k}", strategy="feedback", turn=0, policy_id="solver") for k in range(2)]  # skipped
    rows += [advantage_row(f"v{k}", strategy="iid", agent_id="verifier", policy_id="verifier") for k in range(4)]
    strategies = {"iid": IID(), "feedback": Feedback(first_attempt="skip")}
    view, _ = build_training_view(advantages_table(rows), strategies, tok, ViewConfig(strategy_weights={"iid": 1.0, "feedback": 1.0}))
    w = dict(zip(view.column("step_id").to_pylist(), view.column("sample_weight").to_pylist()))
    assert set(w) == {"i0", "i1", "f0", "f1", "v0", "v1", "v2", "v3"}
    # the Solver trains 2 iid + 2 feedback rows: the 1:1 mix gives every row weight 1
    assert [w[k] for k in ("i0", "i1", "f0", "f1")] == pytest.approx([1.0] * 4)
    # the Verifier trains iid rows only: its weights stay 1
    assert [w[f"v{k}"] for k in range(4)] == pytest.approx([1.0] * 4)
    # 3:1 mixture weights: iid rows carry 3/4 of the Solver's total weight 4
    view, _ = build_training_view(advantages_table(rows), strategies, tok, ViewConfig(strategy_weights={"iid": 3.0, "feedback": 1.0}))
    w = dict(zip(view.column("step_id").to_pylist(), view.column("sample_weight").to_pylist()))
    assert w["i0"] + w["i1"] == pytest.approx(3.0) and w["f0"] + w["f1"] == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="no weight for strategy.*feedback"):
        build_training_view(advantages_table(rows), strategies, tok, ViewConfig(strategy_weights={"iid": 1.0}))


def test_verdicts_are_balanced_from_the_verdict_column(tok):
    rows = [advantage_row(f"no{k}", agent_id="verifier", turn=1, verdict=False, advantage=0.0) for k in range(3)]
    rows += [advantage_row("yes", agent_id="verifier", turn=1, verdict=True, advantage=0.0)]
    rows += [advantage_row("unparsable", agent_id="verifier", turn=1, verdict=None, advantage=0.0)]
    rows += [advantage_row("solver", advantage=0.0)]
    config = ViewConfig(drop_zero_advantage=False, balance_verdicts=True)
    view, _ = build_training_view(advantages_table(rows), {"iid": IID()}, tok, config)
    w = dict(zip(view.column("step_id").to_pylist(), view.column("sample_weight").to_pylist()))
    assert w["yes"] == pytest.approx(2.0) and w["no0"] == pytest.approx(2.0 / 3)
    assert w["unparsable"] == 1.0 and w["solver"] == 1.0
    unbalanced, _ = build_training_view(advantages_table(rows), {"iid": IID()}, tok, ViewConfig(drop_zero_advantage=False))
    assert set(unbalanced.column("sample_weight").to_pylist()) == {1.0}
    with pytest.raises(DataError, match="verdict"):
        build_training_view(advantages_table(rows).drop_columns(["verdict"]), {"iid": IID()}, tok, config)


def test_relabel_verdicts_trains_wrong_verdicts_on_the_right_one(tok):
    """rs + relabel_verdicts: a Verifier row whose verdict was wrong is trained on the most common
    right completion of the other verdict (reward 1, verdict flipped, counted); without a right
    row of that kind it stays out; Solver rows are untouched; ratio losses cannot use it."""
    def v(step_id, verdict, right, ids):
        r = 1.0 if right else 0.0
        return advantage_row(step_id, agent_id="verifier", turn=1, verdict=verdict, completion_ids=ids,
                             completion_logprobs=[-0.1 * len(ids)] * len(ids), global_reward=r, local_reward=r, reward=r)
    rows = [
        v("no-right-a", False, True, [20, 1]), v("no-right-b", False, True, [20, 1]), v("no-right-c", False, True, [21, 22, 1]),
        v("yes-right", True, True, [30, 1]),
        v("yes-wrong", True, False, [30, 1]),     # said yes to a wrong answer -> trained as "no" ([20, 1], the most common)
        v("no-wrong", False, False, [20, 1]),     # said no to a right answer -> trained as "yes" ([30, 1])
        v("unparsable", None, False, [40, 1]),    # no verdict: nothing to relabel, stays out
        advantage_row("solver-wrong", local_reward=0.0, global_reward=0.0, reward=0.0),
    ]
    config = ViewConfig(drop_zero_advantage=False, min_reward=1.0, reward_is_local=True, relabel_verdicts=True)
    view, stats = build_training_view(advantages_table(rows), {"iid": IID()}, tok, config)
    got = dict(zip(view.column("step_id").to_pylist(), view.column("completion_ids").to_pylist()))
    assert set(got) == {"no-right-a", "no-right-b", "no-right-c", "yes-right", "yes-wrong", "no-wrong"}
    assert got["yes-wrong"] == [20, 1] and got["no-wrong"] == [30, 1] and got["no-right-c"] == [21, 22, 1]
    lp = dict(zip(view.column("step_id").to_pylist(), view.column("sampling_logprobs").to_pylist()))
    assert len(lp["yes-wrong"]) == 2 and stats.n_relabeled == 2
    plain, plain_stats = build_training_view(advantages_table(rows), {"iid": IID()}, tok, dataclasses.replace(config, relabel_verdicts=False))
    assert "yes-wrong" not in plain.column("step_id").to_pylist() and plain_stats.n_relabeled == 0
    # no right "yes" this round: a wrong "no" has nothing to become and stays out
    only_no = [r for r in rows if r["step_id"] != "yes-right"]
    view, stats = build_training_view(advantages_table(only_no), {"iid": IID()}, tok, config)
    assert "no-wrong" not in view.column("step_id").to_pylist() and stats.n_relabeled == 1
    with pytest.raises(ConfigError, match="relabel_verdicts needs the rs loss"):
        ViewConfig(relabel_verdicts=True)


def test_rs_view_refuses_a_reward_that_is_not_the_rows_own(tok):
    """With alpha > 0 a wrong first attempt (local 0) in a trajectory that later succeeds
    (global 1) has reward 1: the rs view would fine-tune on it. It is an error instead."""
    config = ViewConfig(drop_zero_advantage=False, min_reward=1.0, reward_is_local=True)
    mixed = [advantage_row("wrong-first", global_reward=1.0, local_reward=0.0, reward=1.0), advantage_row("right", global_reward=1.0, local_reward=1.0, reward=2.0)]
    with pytest.raises(ConfigError, match=r"local_reward.*'wrong-first'.*--alpha 0"):
        build_training_view(advantages_table(mixed), {"iid": IID()}, tok, config)
    own = [advantage_row("wrong-first", global_reward=1.0, local_reward=0.0, reward=0.0), advantage_row("right", global_reward=1.0, local_reward=1.0, reward=1.0)]
    view, _ = build_training_view(advantages_table(own), {"iid": IID()}, tok, config)
    assert view.column("step_id").to_pylist() == ["right"]


def test_dropped_strategies_are_sampled_but_not_trained(tok):
    rows = [advantage_row("i"), advantage_row("h", strategy="prompt_aug")]
    view, stats = build_training_view(advantages_table(rows), {"iid": IID(), "prompt_aug": PromptAug()}, tok, ViewConfig(drop_strategies=("prompt_aug",)))
    assert view.column("step_id").to_pylist() == ["i"] and stats.n_not_trainable == 1


def test_verifier_replay_labels_dedups_balances_and_replaces_the_verifier_rows(tok):
    """The replay: every judged answer of the window with its right verdict (a wrong verdict
    relabelled), one row per training prompt (the newest round's), yes/no balanced, strategy
    "replay", reward 1; it replaces the view's own Verifier rows and leaves the Solver's alone."""
    from pipeline.learn.verifier_replay import REPLAY_STRATEGY, verifier_replay, with_verifier_replay

    def v(step_id, rnd, question, verdict, right, ids, global_reward=0.0):
        r = 1.0 if right else 0.0
        return advantage_row(step_id, round=rnd, agent_id="verifier", turn=1, verdict=verdict, completion_ids=ids,
                             completion_logprobs=[-0.1] * len(ids), local_reward=r, global_reward=global_reward,
                             reward=r + global_reward, sampling_messages=[{"role": "user", "content": question}],
                             prompt_ids=[10 + rnd, 11, 12] if question == "same" else [20 + len(step_id), 21])
    new = advantages_table([
        v("r1-yes-right", 1, "same", True, True, [30, 1], global_reward=1.0),  # newest call of the shared prompt
        v("r1-yes-wrong", 1, "q-a", True, False, [30, 1]),                     # said yes to a wrong answer -> "no"
        v("r1-unparsable", 1, "q-b", None, False, [40, 1]),                    # no verdict: not replayed
        advantage_row("r1-solver", round=1, local_reward=1.0, reward=1.0),
    ])
    old = advantages_table([
        v("r0-no-right", 0, "q-cc", False, True, [20, 1]),
        v("r0-no-right-2", 0, "q-ddd", False, True, [20, 1]),
        v("r0-same", 0, "same", True, True, [30, 1]),
    ])
    # the prompt "same" renders to different ids per round in this fixture: give both rows one prompt
    old = old.set_column(old.schema.get_field_index("prompt_ids"), "prompt_ids",
                         pa.array([[24, 21], [25, 21], [11, 11, 12]], pa.list_(pa.int32())))
    new = new.set_column(new.schema.get_field_index("prompt_ids"), "prompt_ids",
                         pa.array([[11, 11, 12], [26, 21], [27, 21], [3, 4, 5]], pa.list_(pa.int32())))
    replay, n_relabeled = verifier_replay([new, old], {"iid": IID()}, tok, ViewConfig())
    ids = replay.column("step_id").to_pylist()
    assert set(ids) == {"r1-yes-right", "r1-yes-wrong", "r0-no-right", "r0-no-right-2"} and n_relabeled == 1
    assert set(replay.column("strategy").to_pylist()) == {REPLAY_STRATEGY}
    assert set(replay.column("reward").to_pylist()) == {1.0}  # the verdict's own correctness, not the team's
    got = dict(zip(ids, replay.column("completion_ids").to_pylist()))
    assert got["r1-yes-wrong"] == [20, 1]
    w = dict(zip(ids, replay.column("sample_weight").to_pylist()))
    assert w["r1-yes-right"] == pytest.approx(2.0) and w["r0-no-right"] == pytest.approx(2.0 / 3)  # 1 yes vs 3 no
    view, _ = build_training_view(new, {"iid": IID()}, tok, ViewConfig(drop_zero_advantage=False))
    merged = with_verifier_replay(view, replay, "verifier")
    assert sorted(merged.column("step_id").to_pylist()) == sorted(ids + ["r1-solver"])
    with pytest.raises(DataError, match="local_reward"):
        verifier_replay([new.drop_columns(["local_reward"])], {"iid": IID()}, tok)
    with pytest.raises(ConfigError, match="verifier_replay"):
        ViewConfig(verifier_replay=-1)


def test_verdict_training_on_yes_no_replies_is_refused_for_a_verifier_that_solves_again():
    """Relabelled or replayed Verifier rows are yes/no replies: refused when the task's Verifier
    answers the problem itself (the arithmetic task), allowed for a yes/no Verifier."""
    from pipeline.errors import ConfigError
    from pipeline.tasks.arithmetic import ArithmeticTask
    from pipeline.tasks.prompts import PromptTemplate
    from pipeline.learn.verdicts import check_verdict_training

    relabel = ViewConfig(min_reward=1.0, reward_is_local=True, relabel_verdicts=True)
    replay = ViewConfig(min_reward=1.0, reward_is_local=True, verifier_replay=2)
    for config, flag in ((relabel, "--relabel-verdicts"), (replay, "--verifier-replay")):
        with pytest.raises(ConfigError, match=flag):
            check_verdict_training(ArithmeticTask(), config)
        check_verdict_training(ArithmeticTask(prompts=PromptTemplate()), config)  # a yes/no Verifier
    check_verdict_training(ArithmeticTask(), ViewConfig())


class _ScriptedWordSampler:
    """Answers every Solver prompt with "#### 3" and every Verifier prompt with "Verdict: no"
    (the chain-of-thought template's Verifier is asked for a verdict line), one token per char."""

    engine = "scripted"
    model_version = "scripted-v0"

    def __init__(self) -> None:
        from fakes import FakeTokenizer

        self.tokenizer = FakeTokenizer()

    def generate(self, prompt_ids, n, temperature, max_tokens, seed):
        from pipeline.types import Sample

        out = []
        for prompt in prompt_ids:
            text = self.tokenizer.decode(prompt)
            reply = "Verdict: no" if "Verdict:" in text.rsplit("\x02", 1)[-1] else "#### 3"
            ids = self.tokenizer.encode(reply)
            out.append([Sample(token_ids=ids, logprobs=[-0.5] * len(ids), text=reply, finish_reason="stop") for _ in range(n)])
        return out


@pytest.mark.parametrize("train_context", ["problem", "attempt"])
def test_feedback_second_attempt_trains_under_its_own_question_on_a_few_shot_file_task(train_context):
    """The GSM8K-style file task shows worked examples as earlier chat turns: every second
    attempt's training prompt holds its own question (and the examples), never the feedback."""
    from pathlib import Path

    from fakes import FakeTokenizer
    from pipeline.learn.advantages import compute_advantages
    from pipeline.workflows.math import MathWorkflow
    from pipeline.config import AdvantageConfig
    from pipeline.rollout.loop import run_rollouts
    from pipeline.rollout.sampling import RolloutConfig
    from pipeline.tasks.files import load_task_file

    task = load_task_file(Path(__file__).parent / "data" / "gsm8k" / "train_sample.jsonl")
    assert len(task.prompts.examples) >= 2  # the point of the test: a few-shot opening
    problems = task.problems("train", 3, seed=0)
    tok = FakeTokenizer()
    steps = run_rollouts(problems, MathWorkflow(task), [Feedback(group_size=2, train_context=train_context)], _ScriptedWordSampler(), RolloutConfig(max_tokens=16), tokenizer=tok)
    adv = compute_advantages(pl.from_arrow(steps), AdvantageConfig(alpha=0.0, local_weight=1.0))
    view, _ = build_training_view(adv.to_arrow(), {"feedback": Feedback(train_context=train_context)}, tok, ViewConfig(drop_zero_advantage=False))
    rows = view.filter(pa.compute.and_(pa.compute.equal(view.column("agent_id"), "solver"), pa.compute.equal(view.column("turn"), 1))).to_pylist()
    assert len(rows) == 3 * 2
    question = {p.uid: p.question for p in problems}
    uid_of = dict(zip(steps.column("step_id").to_pylist(), steps.column("uid").to_pylist()))
    wrong = task.prompts.fill(task.prompts.wrong_feedback, "")
    right = task.prompts.fill(task.prompts.right_feedback, "")
    for row in rows:
        text = tok.decode(row["train_prompt_ids"])
        own = question[uid_of[row["step_id"]]]
        assert own in text, row["step_id"]
        in_examples = sum(solution.count("#### 3") for _, solution in task.prompts.examples)
        assert text.count("#### 3") == in_examples + (train_context == "attempt")  # attempt1 only under "attempt"
        assert text.index(own) > max(text.index(q) for q, _ in task.prompts.examples)  # after the examples
        for feedback in (wrong, right):
            assert feedback.strip() not in text, row["step_id"]
        for ex_question, _ in task.prompts.examples:
            assert ex_question in text  # the worked examples stay
        assert row["context_swapped"] is True


def test_feedback_context_of_the_wrong_shape_is_a_named_error(tok):
    odd = [{"role": "user", "content": "5+5="}, {"role": "user", "content": "Wrong."}]
    rows = [advantage_row("bad-row", strategy="feedback", turn=1, sampling_messages=odd, prompt_ids=encode_prompt(tok, odd))]
    with pytest.raises(DataError, match="step_id 'bad-row'.*assistant, user"):
        build_training_view(advantages_table(rows), {"feedback": Feedback()}, tok)


def test_stratified_weights_count_what_each_strategy_sampled_not_what_survived_the_advantage_filter(tok):
    """The plan's n_s is a strategy's sample count: iid drew 4 rows (2 of them in a degenerate,
    zero-advantage group), prompt_aug 2; at weights 1:1 an iid row weighs half a prompt_aug row."""
    rows = [advantage_row(f"i{k}", strategy="iid", uid="p0", advantage=1.0 if k == 0 else -1.0) for k in range(2)]
    rows += [advantage_row(f"d{k}", strategy="iid", uid="p1", advantage=0.0) for k in range(2)]  # all-equal group
    rows += [advantage_row(f"h{k}", strategy="prompt_aug", advantage=1.0 if k == 0 else -1.0) for k in range(2)]
    view, _ = build_training_view(advantages_table(rows), {"iid": IID(), "prompt_aug": PromptAug()}, tok, ViewConfig(strategy_weights={"iid": 1.0, "prompt_aug": 1.0}))
    w = dict(zip(view.column("step_id").to_pylist(), view.column("sample_weight").to_pylist()))
    assert set(w) == {"i0", "i1", "h0", "h1"}
    # N = 6 sampled, w_s = 1/2: iid 1/2 * 6/4 = 0.75, prompt_aug 1/2 * 6/2 = 1.5
    assert [w["i0"], w["i1"], w["h0"], w["h1"]] == pytest.approx([0.75, 0.75, 1.5, 1.5])
