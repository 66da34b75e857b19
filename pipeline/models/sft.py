"""Supervised training of models built in code: (messages, target) pairs encoded exactly as the
chat template renders them, in one tokenizer call per batch, and padded into tensors; the SFT loop
of the embedded models' warm starts (`sft_steps`); and sampling their completions to measure
them (`generate_texts` under `seeded_sampling`). The step-matched SFT baseline uses the encoders."""

from __future__ import annotations

import contextlib
import math
from typing import Callable, Iterator, Sequence

from pipeline.errors import ConfigError
from pipeline.models.loading import left_padded
from pipeline.types import Message

__all__ = ["FastEncoder", "encode_messages_fast", "batch_tensors", "sft_step", "sft_steps", "warmup_cosine", "seeded_sampling", "generate_texts"]


class FastEncoder:
    """Renders messages exactly as the chat template does (role marker, content, EOS per
    message, then the assistant marker), encoding all contents of a batch in one call.
    `check` compares it to `encode_prompt` so the two can never drift apart silently."""

    def __init__(self, tokenizer) -> None:
        from pipeline.models.tokenizer import ROLE_TOKENS

        self.tok = tokenizer
        self.role_id = {r: tokenizer.convert_tokens_to_ids(t) for r, t in ROLE_TOKENS.items()}
        self.eos = tokenizer.eos_token_id

    def encode(self, examples: Sequence[tuple[Sequence[Message], str]]) -> list[tuple[list[int], list[int]]]:
        texts: list[str] = []
        for msgs, target in examples:
            texts += [m["content"] for m in msgs] + [target]
        enc = iter(self.tok(texts, add_special_tokens=False)["input_ids"])
        out = []
        for msgs, _ in examples:
            prompt: list[int] = []
            for m in msgs:
                prompt += [self.role_id[m["role"]], *next(enc), self.eos]
            prompt.append(self.role_id["assistant"])
            out.append((prompt, [*next(enc), self.eos]))
        return out

    def check(self, examples: Sequence[tuple[Sequence[Message], str]]) -> None:
        from pipeline.models.chat import encode_prompt

        for (msgs, target), (prompt, completion) in zip(examples, self.encode(examples)):
            full = self.tok.apply_chat_template(
                [*msgs, {"role": "assistant", "content": target}], tokenize=True, return_dict=False
            )
            if encode_prompt(self.tok, msgs) != prompt or list(full) != prompt[:-1] + [prompt[-1], *completion]:
                raise ConfigError("the tokenizer's chat template does not render as <|role|>content<|end|>; "
                                  "warm start needs the default model's template")


def encode_messages_fast(tokenizer, examples):
    """(prompt_ids, completion_ids) of (messages, target) pairs, identical to the chat template."""
    return FastEncoder(tokenizer).encode(examples)


def batch_tensors(pairs: list[tuple[list[int], list[int]]], pad_id: int):
    import torch

    # Right padding: with causal attention no real token ever attends to the padding after it,
    # so no attention mask is needed (and the masked path is several times slower on CPU).
    L = max(len(p) + len(c) for p, c in pairs)
    ids = torch.full((len(pairs), L), pad_id, dtype=torch.long)
    labels = torch.full((len(pairs), L), -100, dtype=torch.long)
    for i, (p, c) in enumerate(pairs):
        seq = p + c
        ids[i, : len(seq)] = torch.tensor(seq)
        labels[i, len(p) : len(seq)] = torch.tensor(c)
    return ids, labels


def sft_step(model, optimizer, pairs: Sequence[tuple[list[int], list[int]]], pad_id: int) -> float:
    """One optimizer step of `model` on encoded (prompt, completion) pairs; returns its loss: the
    mean cross-entropy over all completion tokens of the batch, EOS included. The pairs, sorted
    by length, run as two buckets (short prompts are not padded to the long ones; the loss is the
    same); the gradient norm is clipped to 1."""
    import torch

    pairs = sorted(pairs, key=lambda pc: len(pc[0]) + len(pc[1]))
    n_tokens = sum(len(c) for _, c in pairs)
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for part in (pairs[: len(pairs) // 2], pairs[len(pairs) // 2 :]):
        if not part:
            continue
        ids, labels = batch_tensors(part, pad_id)
        logits = model(input_ids=ids).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100, reduction="sum"
        ) / n_tokens
        loss.backward()
        total += loss.item()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return total


def sft_steps(
    model,
    tokenizer,
    examples: Callable[[int], Sequence[tuple[Sequence[Message], str]]],
    *,
    steps: int,
    lr: float,
    lr_lambda: Callable[[int], float],
    weight_decay: float = 0.0,
) -> Iterator[tuple[int, float]]:
    """Train `model` in place by SFT, one optimizer step per item: yields (step, loss) after each
    step (1-based; `sft_step`), on the batch `examples(step)`, up to `steps` steps or until the
    caller stops. AdamW (betas 0.9, 0.98) at `lr` times `lr_lambda(step - 1)`. The model is left
    in train mode."""
    import torch

    enc = FastEncoder(tokenizer)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    model.train()
    for step in range(1, steps + 1):
        loss = sft_step(model, opt, enc.encode(examples(step)), tokenizer.pad_token_id)
        sched.step()
        yield step, loss


def warmup_cosine(warmup_steps: int, steps: int, low: float) -> Callable[[int], float]:
    """An `lr_lambda` for `sft_steps`: linear warm-up over `warmup_steps`, then a cosine from 1 to
    `low` (the final rate over the peak) at `steps`."""

    def lr_at(s: int) -> float:
        if s < warmup_steps:
            return (s + 1) / warmup_steps
        frac = (s - warmup_steps) / max(1, steps - warmup_steps)
        return low + (1 - low) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))

    return lr_at


@contextlib.contextmanager
def seeded_sampling(model, seed: int):
    """`model` in eval mode without gradients, torch's generator seeded with `seed` and restored
    afterwards (so a measurement neither depends on nor moves the caller's random state), and
    the model's mode restored."""
    import torch

    was_training = model.training
    model.eval()
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        yield
    model.train(was_training)


def generate_texts(model, tokenizer, prompts: Sequence[list[int]], temperature: float, max_new_tokens: int, batch_size: int) -> list[str]:
    """The completion of each prompt (token ids), sampled with transformers at `temperature`
    (top_k=0, top_p=1: the plain temperature distribution; 0 = greedy), `batch_size` prompts per
    `generate` call (left-padded), special tokens dropped."""
    texts: list[str] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        ids, mask = left_padded(chunk, tokenizer.pad_token_id)
        kw = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else dict(do_sample=False)
        out = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id, **kw,
        )
        texts += tokenizer.batch_decode(out[:, ids.shape[1] :], skip_special_tokens=True)
    return texts
