"""A tiny tokenizer with a chat template and a tiny random Llama, built in code for tests.

No download: the tokenizer is a byte-level BPE without merges (every byte is a token) plus the
chat specials, wrapped in `PreTrainedTokenizerFast`; the model is a random `LlamaForCausalLM`
of a few thousand parameters. `tiny_model_dir(path)` writes both to one HF model directory, the
form every maxit part loads checkpoints from.
"""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIALS = ["<pad>", "<eos>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]


def tiny_tokenizer():
    """A `PreTrainedTokenizerFast`: 256 byte tokens + 6 specials, with `CHAT_TEMPLATE`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<eos>",
        model_max_length=256,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_model(vocab_size: int, seed: int = 0, hidden: int = 32, layers: int = 2, max_positions: int = 256):
    """A random `LlamaForCausalLM` (fp32, no dropout)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).float()


def tiny_model_dir(path: str | Path, seed: int = 0, hidden: int = 32, layers: int = 2) -> Path:
    """Write the tiny tokenizer and a tiny random model to `path` (an HF model directory)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = tiny_tokenizer()
    model = tiny_model(len(tok), seed=seed, hidden=hidden, layers=layers)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def advantage_row(step_id: str, **values) -> dict:
    """One advantages-table row with plausible defaults; `values` override any column."""
    row = {
        "round": 0,
        "step_id": step_id,
        "strategy": "iid",
        "uid": "p0",
        "traj_uid": f"t-{step_id}",
        "sample_idx": 0,
        "agent_id": "solver",
        "policy_id": "shared",
        "turn": 0,
        "step": 0,
        "node_id": f"n-{step_id}",
        "parent_node_id": None,
        "selected": True,
        "active": True,
        "sampling_messages": [{"role": "user", "content": "1+2="}],
        "prompt_hash": "h",
        "prompt_ids": [3, 4, 5],
        "completion_ids": [6, 7],
        "completion_logprobs": [-0.5, -0.25],
        "completion_text": "3",
        "finish_reason": "stop",
        "global_reward": 1.0,
        "local_reward": 0.0,
        "reward": 1.0,
        "reward_error": None,
        "verdict": None,
        "model_version": "v0",
        "engine": "hf",
        "seed": 0,
        "temperature": 1.0,
        "group_size": 4,
        "group_mean": 0.5,
        "group_std": 0.5,
        "advantage": 1.0,
        "sample_weight": 1.0,
    }
    unknown = set(values) - set(row)
    if unknown:
        raise KeyError(f"unknown advantages column(s) {sorted(unknown)}")
    row.update(values)
    return row


def advantages_table(rows: list[dict]):
    """An Arrow table of `advantage_row`s with exactly the `advantages` schema."""
    import pyarrow as pa

    from schemas import ADVANTAGES

    return pa.Table.from_pylist(rows, schema=ADVANTAGES.schema)
