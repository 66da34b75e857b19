"""The forward pass of a training batch: log p of each completion token at the sampling
temperature (`completion_logps`), with only the completion positions projected to the vocabulary
(in chunks under a logits budget), and a prompt prefix that every row shares computed once, as
one row, whose keys and values the rows then attend to (`model_inputs`, `_PrefixLayer`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Mapping, Sequence

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer
from transformers.modeling_layers import GradientCheckpointingLayer
from trl.trainer.utils import selective_log_softmax

__all__ = ["completion_logps", "common_prefix", "shared_prefix_length", "autocast_context", "model_inputs"]


def autocast_context(dtype: torch.dtype | None, device: torch.device):
    """bf16 autocast on `device` when `dtype` is bfloat16 (float32 weights, bf16 matmuls), else nothing."""
    if dtype is None or dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def _head_logps(head, hidden: torch.Tensor, completion_ids: torch.Tensor, temperature: float) -> torch.Tensor:
    return selective_log_softmax(head(hidden).float(), completion_ids, temperature)


def _plain_head(model) -> bool:
    """True when the logits are the output projection of the last hidden state and nothing more
    (no logit scaling or soft-capping), so projecting a slice of it is exact."""
    cfg = model.config
    return not any(getattr(cfg, name, None) for name in ("final_logit_softcapping", "logit_scale", "logits_scaling"))


def common_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """How many tokens all of `prompts` (two or more) begin with, at most the shortest less one
    token: each row keeps its last prompt token, whose logit predicts its first completion token."""
    if len(prompts) < 2:
        return 0
    first, width = prompts[0], min(len(p) for p in prompts) - 1
    n = 0
    while n < width and all(p[n] == first[n] for p in prompts):
        n += 1
    return n


def shared_prefix_length(batch: Mapping[str, Any]) -> int:
    """`common_prefix` of the training prompts of a `collate`d batch (left-padded)."""
    prompt_ids, p_len = batch["prompt_ids"], batch["prompt_ids"].shape[1]
    return common_prefix([prompt_ids[i, p_len - int(n) :].tolist() for i, n in enumerate(batch["prompt_mask"].sum(1).tolist())])


class _PrefixLayer(DynamicLayer):
    """One layer's keys and values of the shared prefix, the same for every row (an expanded
    view, so the backward pass sums the rows' gradients into the one prefix pass). `update` never
    stores: it returns the prefix's states followed by the new tokens', so a layer recomputed under
    gradient checkpointing reads exactly what it read the first time."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, rows: int):
        super().__init__()
        self.lazy_initialization(keys, values)
        self.keys = keys.expand(rows, *keys.shape[1:])
        self.values = values.expand(rows, *values.shape[1:])

    def update(self, key_states, value_states, *args, **kwargs):
        return torch.cat([self.keys, key_states], dim=-2), torch.cat([self.values, value_states], dim=-2)


def _checkpointed_layers(model) -> list:
    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


@contextlib.contextmanager
def _layers_flag(layers: Sequence[Any], name: str, value: bool):
    """Set the attribute `name` on every layer of `layers` for the duration (instance attributes,
    removed again, so the class's value is back afterwards)."""
    had = [(layer, name in vars(layer), getattr(layer, name)) for layer in layers]
    for layer in layers:
        setattr(layer, name, value)
    try:
        yield
    finally:
        for layer, own, old in had:
            if own:
                setattr(layer, name, old)
            else:
                delattr(layer, name)


def model_inputs(model, batch: Mapping[str, Any], share_prefix: int) -> tuple[dict[str, Any], contextlib.AbstractContextManager]:
    """The forward pass's inputs for `batch` (ids, attention mask, positions; with a shared prefix
    the prefix's cache too) and the context the forward runs in. With `share_prefix` > 0 and at least
    that many tokens common to every row's prompt (`shared_prefix_length`), the prefix runs once, as
    one row, and the rows run only their own tokens on top of its keys and values: the same
    logprobs and gradients as the full rows, with the prefix's tokens processed once instead of once
    per row (rows of one task share its system prompt and worked examples)."""
    prompt_ids, completion_ids = batch["prompt_ids"], batch["completion_ids"]
    prompt_mask = batch["prompt_mask"]
    attention_mask = torch.cat([prompt_mask, batch["completion_mask"].to(prompt_mask.dtype)], dim=1)
    # positions count real tokens only, so a left-padded row sees the positions it had unpadded
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    prefix = shared_prefix_length(batch) if share_prefix > 0 else 0
    cache = DynamicCache(config=model.config) if prefix >= max(share_prefix, 1) else None
    # only plain attention layers share: a sliding window or a recurrent state keeps other states
    if cache is None or not cache.layers or any(type(layer) is not DynamicLayer for layer in cache.layers):
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        return dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False), contextlib.nullcontext()
    b, p_len = prompt_ids.shape
    first = p_len - int(prompt_mask[0].sum())
    prefix_ids = prompt_ids[:1, first : first + prefix]
    layers = _checkpointed_layers(model)
    # the prefix is one row: its activations are kept (no checkpointing, which would drop the cache)
    with _layers_flag(layers, "gradient_checkpointing", False):
        model.get_decoder()(
            input_ids=prefix_ids, attention_mask=torch.ones_like(prefix_ids), position_ids=torch.arange(prefix, device=prefix_ids.device)[None],
            past_key_values=cache, use_cache=True,
        )
    shared = Cache(layers=[_PrefixLayer(layer.keys, layer.values, b) for layer in cache.layers])
    # each row without its first `prefix` prompt tokens: the prompt columns after them, masked
    # where the row's own tokens had not begun; the prefix's columns stay in the mask and positions
    rest_mask = prompt_mask[:, prefix:].clone()
    for i, n in enumerate(prompt_mask.sum(1).tolist()):
        rest_mask[i, : rest_mask.shape[1] - (int(n) - prefix)] = 0
    full_mask = torch.cat([torch.ones(b, prefix, dtype=prompt_mask.dtype, device=prompt_mask.device), rest_mask, attention_mask[:, p_len:]], dim=1)
    input_ids = torch.cat([torch.where(rest_mask.bool(), prompt_ids[:, prefix:], prompt_ids[:, :1]), completion_ids], dim=1)
    inputs = dict(
        input_ids=input_ids, attention_mask=full_mask, position_ids=position_ids[:, prefix:], past_key_values=shared, use_cache=False,
    )
    # the layers only read `shared`, so gradient checkpointing may keep it for the recompute
    return inputs, _layers_flag(layers, "_can_checkpoint_with_cache", True)


def completion_logps(
    model, batch: Mapping[str, Any], temperature: float, max_logit_elements: int | None = None, share_prefix: int = 0
) -> torch.Tensor:
    """(B, C) log p(completion token | training prompt, earlier completion tokens) at `temperature`
    (0 on padding). Only the C positions that predict completion tokens are projected to the
    vocabulary, and the log-softmax is taken at the completion tokens only (TRL's
    `selective_log_softmax`). When B x C x vocabulary exceeds `max_logit_elements`, the projection
    runs a few rows at a time, each chunk under activation checkpointing (its logits are
    recomputed in the backward pass instead of kept), so peak memory holds one chunk's logits.
    `share_prefix` > 0: a prompt prefix of at least that many tokens common to all rows is
    computed once (`model_inputs`)."""
    completion_ids = batch["completion_ids"]
    inputs, context = model_inputs(model, batch, share_prefix)
    b, c = completion_ids.shape
    if max_logit_elements is None or not _plain_head(model) or b * c * int(model.config.vocab_size) <= max_logit_elements:
        with context:
            logits = model(**inputs, logits_to_keep=c + 1).logits
        # position t predicts completion token t; TRL's selective_log_softmax divides by the
        # temperature and takes logit - logsumexp at the chosen token, one row at a time
        logps = selective_log_softmax(logits[:, :-1, :].float(), completion_ids, temperature)
        return logps * batch["completion_mask"]
    with context:
        hidden = model.get_decoder()(**inputs).last_hidden_state[:, -(c + 1) : -1, :]
    head = model.get_output_embeddings()
    rows = max(1, max_logit_elements // (c * int(model.config.vocab_size)))
    parts = []
    for i in range(0, b, rows):
        args = (head, hidden[i : i + rows], completion_ids[i : i + rows], temperature)
        if torch.is_grad_enabled():
            parts.append(torch.utils.checkpoint.checkpoint(_head_logps, *args, use_reentrant=False))
        else:
            parts.append(_head_logps(*args))
    return torch.cat(parts) * batch["completion_mask"]
