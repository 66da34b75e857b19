"""Supervised examples for models built in code: (messages, target) pairs encoded exactly as the
chat template renders them, in one tokenizer call per batch, and padded into tensors. The warm
starts of the embedded models and the step-matched SFT baseline use them."""

from __future__ import annotations

from typing import Sequence

from pipeline.errors import ConfigError
from pipeline.types import Message

__all__ = ["FastEncoder", "encode_messages_fast", "batch_tensors"]


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
