"""Tic-tac-toe's embedded model: the grid's character-level tokenizer with one token more per cell
and content (`CELL_TOKENS`: "x0" ... ".8", the words of the prompt's `cells:` line) and a tiny Llama
(`pipeline.models.build.ModelConfig`: 4 x 128, untied output layer, initial weights of standard
deviation 0.1 where transformers' default is 0.02), warm-started in code on the game's own prompts
(no download), cached under `<cache>/models/tictactoe-<hash of the settings>`. With the cells as
tokens and the larger initial weights the model learns the game's tactics from its examples about
as fast as an MLP given the cells (docs/results/games.md); with neither it learned them about ten
times slower.

Warm start: SFT at positions of random games, never at a held-out problem's position nor at one of
its mirror images (`pipeline.workflows.games.positions.position_splits` at the workflow's default opening
and `heldout_fraction`: the split the workflow's problems use), every target one cell digit. The first
`clean_steps` train on the mover's best moves (a move whose minimax result is the best the mover
can get, `pipeline.workflows.games.spiel.solved_value`); after them a share `noise` of the
targets is a random legal cell (most of them by default), so at T=1 the model plays mostly legal,
mostly random moves while its greedy move is mostly a best one, and self-play has room to sharpen
it (the grid model's recipe). Fixed step count, one torch thread, deterministic from the seed.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

from pipeline.errors import ConfigError
from pipeline.models.build import ModelConfig, cached_build, count_parameters, untrained_model
from pipeline.types import Message

__all__ = ["TTTWarmStartConfig", "ttt_sft_examples", "ttt_model", "build_ttt_model", "ttt_model_config", "ttt_tokenizer", "CELL_TOKENS",
           "TTT_BUILD_VERSION"]

CELL_TOKENS = tuple(f"{c}{i}" for c in "xo." for i in range(9))
"""One token per cell and content, as the prompt's `cells:` line writes them (`GameSpec.board_cells`)."""

TTT_BUILD_VERSION = 3
"""Bump when the build code changes what it produces, so old cached models are not reused."""


@dataclass(frozen=True)
class TTTWarmStartConfig:
    """Settings of the tic-tac-toe model's warm-start SFT."""

    steps: int = 500
    clean_steps: int = 400
    """The first steps train on best moves only (reading the board); the steps after mix in `noise`."""
    batch_size: int = 64
    lr: float = 1e-3
    """Lower than the grid's 3e-3, at which this model does not learn within the build's steps which
    cells are free."""
    lr_final: float = 5e-4
    warmup_steps: int = 20
    noise: float = 0.9
    """Share of the targets after `clean_steps` that are a random legal cell instead of a best move."""
    heldout_fraction: float = 0.3
    """The workflow's default: no SFT position is a held-out problem of the workflow's split at
    this fraction and the game's default opening."""
    seed: int = 0
    threads: int | None = 1
    """torch threads of the build (not part of its key; see the grid model's)."""

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or not 0 <= self.clean_steps <= self.steps:
            raise ConfigError("tic-tac-toe warm start: steps, batch_size >= 1 and 0 <= clean_steps <= steps")
        if not 0 <= self.noise <= 1:
            raise ConfigError(f"tic-tac-toe warm start: noise must be in [0, 1], got {self.noise}")


def ttt_sft_examples(rng: random.Random, n: int, config: TTTWarmStartConfig) -> list[tuple[list[Message], str]]:
    """`n` (messages, target cell) pairs at positions of random games that are not held-out problems."""
    from pipeline.workflows.games.env import SPECS, prompt_text
    from pipeline.workflows.games.positions import position_splits
    from pipeline.workflows.games.spiel import Table, best_moves

    spec = SPECS["tic_tac_toe"]
    splits = position_splits(spec, spec.opening, config.heldout_fraction)
    out: list[tuple[list[Message], str]] = []
    while len(out) < n:
        table = Table(spec.name, 0)
        for _ in range(rng.randrange(9)):
            if table.done:
                break
            table.step(rng.choice(table.legal()))
        if table.done or splits.get(str(table.state)) == "heldout":
            continue
        target = rng.choice(table.legal()) if rng.random() < config.noise else rng.choice(best_moves(table))
        out.append(([Message(role="user", content=prompt_text(spec, table, table.agent_selection))], str(target)))
    return out


def ttt_warm_start(model, tokenizer, config: TTTWarmStartConfig, log: Callable[[str], None] = print) -> dict:
    """Train `model` in place by SFT for `config.steps` steps."""
    import torch

    from pipeline.models.sft import sft_steps, warmup_cosine

    torch.manual_seed(config.seed)
    rng = random.Random(f"ttt-warm-start:{config.seed}")
    clean = replace(config, noise=0.0)

    lr_at = warmup_cosine(config.warmup_steps, config.steps, config.lr_final / config.lr)

    t0, loss_avg = time.perf_counter(), math.nan
    examples = lambda step: ttt_sft_examples(rng, config.batch_size, clean if step <= config.clean_steps else config)  # noqa: E731
    for step, loss in sft_steps(model, tokenizer, examples, steps=config.steps, lr=config.lr, lr_lambda=lr_at):
        loss_avg = loss if math.isnan(loss_avg) else 0.95 * loss_avg + 0.05 * loss
        if step % 20 == 0 or step == config.steps:
            log(f"tic-tac-toe warm start: step {step:4d}/{config.steps}  loss {loss_avg:.3f}  {time.perf_counter() - t0:5.1f}s")
    model.eval()
    return {"steps": config.steps, "seconds": time.perf_counter() - t0, "final_loss": loss_avg}


def ttt_model_config(seed: int = 0) -> ModelConfig:
    """The model's architecture: the default 4 x 128 Llama, its output layer untied from the input
    embedding and its initial weights drawn at standard deviation 0.1."""
    return ModelConfig(seed=seed, tie_word_embeddings=False, initializer_range=0.1)


def ttt_tokenizer(model_max_length: int):
    """The grid's character-level tokenizer plus `CELL_TOKENS`."""
    from pipeline.workflows.grid.model import build_grid_tokenizer

    tok = build_grid_tokenizer(model_max_length)
    tok.add_tokens(list(CELL_TOKENS))
    return tok


def _settings(model_config: ModelConfig, warm: TTTWarmStartConfig) -> dict:
    from pipeline.workflows.games.env import SPECS

    warm_settings = asdict(warm)
    warm_settings.pop("threads", None)
    return {"version": TTT_BUILD_VERSION, "model": model_config.key(), "warm_start": warm_settings, "spec": asdict(SPECS["tic_tac_toe"])}


def build_ttt_model(cache_dir: str | Path | None = None, warm: TTTWarmStartConfig = TTTWarmStartConfig(), model_config: ModelConfig | None = None,
                    force: bool = False, log: Callable[[str], None] = print) -> Path:
    """Build the tic-tac-toe model (tokenizer, random Llama, warm start) and save it atomically
    under `<cache>/models/tictactoe-<hash>`; a build of the same settings is reused unless `force`."""
    model_config = model_config or ttt_model_config(warm.seed)

    def build(folder: Path) -> dict:
        import torch

        tok, model = untrained_model(model_config, ttt_tokenizer(model_config.max_position_embeddings), folder)
        log(f"tic-tac-toe model: Llama {model_config.num_layers}x{model_config.hidden_size}, {count_parameters(model) / 1e6:.2f}M parameters")
        threads = torch.get_num_threads()
        if warm.threads:
            torch.set_num_threads(warm.threads)
        try:
            with torch.random.fork_rng(devices=[]):
                record = ttt_warm_start(model, tok, warm, log=log)
            model.save_pretrained(str(folder), safe_serialization=True)
        finally:
            torch.set_num_threads(threads)
        return {"build_version": TTT_BUILD_VERSION, "model_config": asdict(model_config), "warm_start_config": asdict(warm), "warm_start": record,
                "parameters": count_parameters(model), "vocab_size": len(tok)}

    return cached_build(cache_dir, "tictactoe", _settings(model_config, warm), build, what="the tic-tac-toe model", force=force, log=log)


def ttt_model(cache_dir: str | Path | None = None, seed: int = 0) -> Path:
    """The warm-started tic-tac-toe model dir: built on the first call, reused afterwards."""
    return build_ttt_model(cache_dir, TTTWarmStartConfig(seed=seed))
