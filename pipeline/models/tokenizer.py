"""The default tokenizer, trained in code with `tokenizers`: byte-level BPE where every digit is
its own token (so numbers are spelled digit by digit), role-marker and EOS/pad special tokens,
and a Jinja chat template; wrapped as a `PreTrainedTokenizerFast`.

Chat format (what `pipeline.models.chat.encode_prompt` renders):

    <|user|>123+45=<|end|><|assistant|>168<|end|>

Every message is its role marker, its content and `<|end|>`; `<|end|>` is the EOS token, so a
generated assistant turn stops exactly where a training target ends. `add_generation_prompt`
appends `<|assistant|>`. The assistant content sits inside `{% generation %}` so
`return_assistant_tokens_mask` works for trainers that use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from pipeline.errors import ConfigError

__all__ = [
    "TokenizerConfig",
    "SPECIAL_TOKENS",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "CHAT_TEMPLATE",
    "train_tokenizer",
]

EOS_TOKEN = "<|end|>"
PAD_TOKEN = "<|pad|>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
SPECIAL_TOKENS = [PAD_TOKEN, EOS_TOKEN, *ROLE_TOKENS.values()]
"""In id order: pad=0, eos=1, then the role markers."""

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "<|assistant|>{% generation %}{{ message['content'] }}<|end|>{% endgeneration %}"
    "{%- elif message['role'] in ['system', 'user'] -%}"
    "<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{%- else -%}"
    "{{ raise_exception('unknown role ' ~ message['role'] ~ '; use system, user or assistant') }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)


@dataclass(frozen=True)
class TokenizerConfig:
    """Settings of the default tokenizer."""

    vocab_size: int = 384
    """Total vocabulary: 256 byte tokens + special tokens + BPE merges learned from the corpus."""
    model_max_length: int = 256
    """Longest sequence (prompt + completion) the tokenizer reports."""

    def __post_init__(self) -> None:
        if self.vocab_size < 256 + len(SPECIAL_TOKENS) + 1:
            raise ConfigError(
                f"tokenizer.vocab_size must exceed 256 bytes + {len(SPECIAL_TOKENS)} special tokens "
                f"(else BPE learns no merges), got {self.vocab_size}"
            )
        if self.model_max_length < 16:
            raise ConfigError(f"tokenizer.model_max_length must be >= 16, got {self.model_max_length}")


def train_tokenizer(corpus: Iterable[str], config: TokenizerConfig = TokenizerConfig()):
    """Train the byte-level BPE on `corpus` (strings of plain text) and wrap it as a
    `PreTrainedTokenizerFast` with the chat template. Deterministic for a given corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Digits are split off one by one before the byte-level split, so no merge can join digits.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=list(ROLE_TOKENS.values()),
        model_max_length=config.model_max_length,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_tokenizer(tokenizer, out_dir: str | Path) -> None:
    tokenizer.save_pretrained(str(out_dir))
