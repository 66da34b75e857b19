"""Can the model learn to check answers at all? A supervised probe of the Verifier, outside RL.

    .venv/bin/python scripts/verifier_probe.py --store runs/default [--model-dir M] [--steps 600] [--lr 5e-4]

Takes every Verifier call of a finished run (`STORE/round=*/steps.parquet`), labels each with the
right verdict (the verdict sampled when its local reward is 1, the other one when it is 0), keeps
one row per distinct prompt, and splits by problem: one problem in five (a hash of `uid`) is held
out. It then fine-tunes the starting model (default: the embedded one) on the other problems'
rows only, in balanced batches (half "yes", half "no"), and every 100 steps prints the
Verifier's balanced verdict accuracy on the held-out problems' prompts: with the likelier verdict
(argmax) and at T=1 (the mean probability of the right verdict, which is what sampling verdicts
at T=1, as the evaluation does, scores on average). The run's own checkpoints are not used.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", required=True)
    ap.add_argument("--model-dir", default=None)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import polars as pl
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.workflows.math.model import default_model
    from pipeline.models.sft import batch_tensors as _batch_tensors, encode_messages_fast

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    model_dir = args.model_dir or default_model()
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    steps = pl.read_parquet(str(Path(args.store) / "round=*" / "steps.parquet"), hive_partitioning=True)
    v = steps.filter((pl.col("agent_id") == "verifier") & pl.col("verdict").is_not_null() & pl.col("local_reward").is_not_null())
    v = v.with_columns(
        label=pl.when(pl.col("local_reward") >= 1).then(pl.col("verdict")).otherwise(~pl.col("verdict")),
        content=pl.col("sampling_messages").list.last().struct.field("content"),
    ).unique("content", keep="first", maintain_order=True)
    held_mask = pl.col("uid").hash(7) % 5 == 0
    held, train = v.filter(held_mask), v.filter(~held_mask)
    word = {True: "yes", False: "no"}
    print(f"{train.height} training prompts ({train['label'].sum()} right answers), {held.height} held-out prompts "
          f"({held['label'].sum()} right answers) from {args.store}")

    def encode(df):
        return encode_messages_fast(tok, [([{"role": "user", "content": c}], word[lab]) for c, lab in zip(df["content"], df["label"])])

    tr, he = encode(train), encode(held)
    yes, no = (tok(w, add_special_tokens=False)["input_ids"][0] for w in ("yes", "no"))
    labels = held["label"].to_list()

    def evaluate() -> tuple[float, float]:
        model.eval()
        hit = {True: [0, 0], False: [0, 0]}
        prob = {True: 0.0, False: 0.0}
        with torch.no_grad():
            for i in range(0, len(he), 256):
                chunk = he[i : i + 256]
                length = max(len(p) for p, _ in chunk)
                ids = torch.zeros((len(chunk), length), dtype=torch.long)
                for j, (p, _) in enumerate(chunk):
                    ids[j, : len(p)] = torch.tensor(p)
                last = torch.tensor([len(p) - 1 for p, _ in chunk])
                probs = model(ids).logits[torch.arange(len(chunk)), last].softmax(-1)
                for j in range(len(chunk)):
                    lab = labels[i + j]
                    py, pn = probs[j, yes].item(), probs[j, no].item()
                    hit[lab][0] += (py > pn) == lab
                    hit[lab][1] += 1
                    prob[lab] += py if lab else pn
        model.train()
        argmax = 0.5 * (hit[True][0] / hit[True][1] + hit[False][0] / hit[False][1])
        t1 = 0.5 * (prob[True] / hit[True][1] + prob[False] / hit[False][1])
        return argmax, t1

    ys = [x for x, lab in zip(tr, train["label"]) if lab]
    ns = [x for x, lab in zip(tr, train["label"]) if not lab]
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    rng = random.Random(0)
    a, t = evaluate()
    print(f"step    0: held-out balanced verdict accuracy {a:.1%} (argmax), {t:.1%} (T=1)", flush=True)
    for step in range(1, args.steps + 1):
        batch = rng.choices(ys, k=args.batch // 2) + rng.choices(ns, k=args.batch - args.batch // 2)
        ids, lab = _batch_tensors(batch, tok.pad_token_id or 0)
        loss = model(input_ids=ids, labels=lab).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % 100 == 0:
            a, t = evaluate()
            print(f"step {step:4d}: loss {loss.item():.3f}, held-out balanced verdict accuracy {a:.1%} (argmax), {t:.1%} (T=1)", flush=True)


if __name__ == "__main__":
    main()
