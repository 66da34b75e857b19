"""What the review model's Solver writes on a retry after a rejection, under three rejection messages.

    PYTHONPATH=. .venv/bin/python scripts/review_retry_probe.py MODEL_DIR

Samples (T=1) first answers to 300 train problems, the Verifier's reply to each, then a retry under
each message; prints the share of non-empty retries and their accuracy after a wrong and after a
right first answer (docs/results/math-review.md)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pipeline.models import load_model, load_tokenizer
from pipeline.models.sft import FastEncoder, generate_texts, seeded_sampling
from pipeline.tasks.arithmetic import ArithmeticTask
from pipeline.tasks.prompts import REVIEW_PROMPTS
from pipeline.types import Message
model_dir = sys.argv[1]
task = ArithmeticTask(prompts=REVIEW_PROMPTS)
tok, model = load_tokenizer(model_dir), load_model(model_dir)
enc = FastEncoder(tok)
probs = task.problems("train", 300, seed=777)
def gen(msgs, T, seed, n=12):
    prompts = [pr for pr, _ in enc.encode([(m, "") for m in msgs])]
    with seeded_sampling(model, seed):
        return [t.strip() for t in generate_texts(model, tok, prompts, T, n, 512)]
first = gen([task.solver_messages(p) for p in probs], 1.0, 1)
ver = gen([task.verifier_messages(p, a) for p, a in zip(probs, first)], 1.0, 2)
right = [task.reward(p, a) == 1.0 for p, a in zip(probs, first)]
print("first acc", sum(right) / len(right))
templates = {
  "default": "The verifier rejected your answer: {v}\nTry again.",
  "wrong_feedback": "That is wrong. Try again.",
  "verifier+wrong_feedback": "{v}\nThat is wrong. Try again.",
}
for name, t in templates.items():
    msgs = [[*task.solver_messages(p), Message(role="assistant", content=a), Message(role="user", content=t.format(v=v))] for p, a, v in zip(probs, first, ver)]
    retry = gen(msgs, 1.0, 3)
    ok = [task.reward(p, r) == 1.0 for p, r in zip(probs, retry)]
    nonempty = sum(bool(r) for r in retry) / len(retry)
    after_wrong = [o for o, rt in zip(ok, right) if not rt]
    after_right = [o for o, rt in zip(ok, right) if rt]
    print(f"{name:26s} nonempty {nonempty:.1%}  retry acc after wrong first {sum(after_wrong)/max(1,len(after_wrong)):.1%} (n={len(after_wrong)})  after right {sum(after_right)/max(1,len(after_right)):.1%} (n={len(after_right)})  examples {retry[:6]}")
