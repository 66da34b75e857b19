"""The grid game's embedded model: a tiny Llama with a character-level tokenizer, built and
warm-started in code (no download), cached under `<cache>/models/grid-<hash of the settings>`.

- Tokenizer: the default model's special tokens and chat template (`pipeline.models.tokenizer`)
  over a byte-level BPE with no merges, so every character of a grid is one token (a merge such
  as ".." would hide where a wall is).
- Architecture: the default model's (`pipeline.models.build.ModelConfig`: 4 x 128 Llama, 256
  positions; a grid prompt is under 60 tokens).
- Warm start: SFT on the game's own prompts (`pipeline.workflows.grid`) at random positions of
  train-split puzzles, every target one move letter: the planner's next move (sometimes with the
  prompt_aug hint, whose letter at the team's cell it learns to read), the mover's committed move
  given a proposal. The first `clean_steps` train on right moves only (the skill); after them a
  share `noise` of the targets is wrong on purpose (the planner: a random letter; the mover: the
  proposal followed half the time, else a random letter), so sampling at T=1 is imperfect while
  the greedy move is mostly right, and rejection sampling on the right moves has room to sharpen
  it (docs/results/grid.md). Fixed step count, one torch thread, deterministic from the seed.
- `grid_model()` builds once (minutes: docs/results/grid.md), then reuses the cached build;
  the build writes `maxit_build.json` with its settings, the SFT record and the held-out team
  success it measured (`play`: the team at T=1 and greedy on held-out puzzles with transformers'
  sampling).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from pipeline.errors import ConfigError
from pipeline.types import Message

from pipeline.models.build import ModelConfig, cached_build, count_parameters, settings_key, scaled_model_config, untrained_model

__all__ = ["GridGame", "GridWarmStartConfig", "build_grid_tokenizer", "grid_sft_examples", "grid_model", "build_grid_model", "play", "GRID_BUILD_VERSION"]

GRID_BUILD_VERSION = 1
"""Bump when the build code changes what it produces, so old cached models are not reused."""


@dataclass(frozen=True)
class GridGame:
    """The generator options the model is warm-started on (`pipeline.workflows.grid.GridWorkflow`'s)."""

    size: int = 4
    walls: int = 3
    min_dist: int = 2
    max_dist: int = 6
    heldout_fraction: float = 0.2
    slack: int = 2


@dataclass(frozen=True)
class GridWarmStartConfig:
    """Settings of the grid model's warm-start SFT."""

    steps: int = 400
    """Optimizer steps in all (fixed: the whole warm start is deterministic from the seed)."""
    clean_steps: int = 300
    """The first steps train on right targets only (the skill: reading the maze); the steps after
    them mix in `noise` (how often the model samples a wrong move at T=1). Trained noisy from the
    start, the 1M model's onset came late, at a step that varied with the data seed; clean first,
    it learns to read mazes early and the noise soon after (docs/results/grid.md)."""
    batch_size: int = 128
    lr: float = 3e-3
    """Peak AdamW learning rate (linear warmup, then cosine to `lr_final`)."""
    lr_final: float = 3e-4
    warmup_steps: int = 30
    noise: float = 0.6
    """Share of the planner's and the mover's targets that are wrong on purpose (after
    `clean_steps`)."""
    hint_noise: float = 0.15
    """The same share for hinted planner examples."""
    on_path: float = 0.5
    """Share of examples at a cell of the start's shortest path (else any reachable cell)."""
    mix_planner: float = 0.45
    mix_hint: float = 0.15
    mix_mover: float = 0.4
    seed: int = 0
    threads: int | None = 1
    """torch threads of the build (restored afterwards; None: leave torch's setting); not part of
    the build's key. One thread: two threads spin-wait for each other on a machine whose cores
    other jobs share, several times slower (docs/results/grid.md), and one thread gives a result
    that does not depend on the machine's core count."""

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1:
            raise ConfigError("grid warm start: steps and batch_size must be >= 1")
        if not 0 <= self.clean_steps <= self.steps:
            raise ConfigError(f"grid warm start: clean_steps must be in [0, steps], got {self.clean_steps}")
        for name in ("noise", "hint_noise", "on_path"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(f"grid warm start: {name} must be in [0, 1], got {getattr(self, name)}")


def build_grid_tokenizer(model_max_length: int = 256):
    """A character-level tokenizer (byte-level BPE without merges) with the default model's special
    tokens and chat template, as a `PreTrainedTokenizerFast` (vLLM and transformers load it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from pipeline.models.tokenizer import CHAT_TEMPLATE, EOS_TOKEN, PAD_TOKEN, ROLE_TOKENS, SPECIAL_TOKENS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=256 + len(SPECIAL_TOKENS),  # the byte alphabet and the specials: no merges
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(["plan\n.#AG", "move UDLR?", "Hint: "], trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=list(ROLE_TOKENS.values()),
        model_max_length=model_max_length,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


# -- SFT examples ------------------------------------------------------------------------------


def _train_puzzle(rng: random.Random, game: GridGame):
    from pipeline.workflows.grid.game import puzzle_split, random_puzzle

    while True:
        p = random_puzzle(rng, game.size, game.walls)
        if p is not None and game.min_dist <= p.shortest <= game.max_dist and puzzle_split(p, game.heldout_fraction) == "train":
            return p


def _position(rng: random.Random, puzzle, on_path: float) -> tuple[int, int]:
    if rng.random() < on_path:
        cells = [puzzle.start]
        for move in puzzle.path()[:-1]:
            cells.append(puzzle.after(cells[-1], move))
        return rng.choice(cells)
    cells = [(r, c) for r in range(puzzle.height) for c in range(puzzle.width) if puzzle.dist[r][c] not in (None, 0)]
    return rng.choice(cells)


def grid_sft_examples(rng: random.Random, n: int, game: GridGame, config: GridWarmStartConfig) -> list[tuple[list[Message], str]]:
    """`n` (messages, target letter) pairs of the mix in `config` on train-split puzzles."""
    from pipeline.strategies import HINT_PREFIX
    from pipeline.workflows.grid.game import MOVES, mover_text, planner_text

    letters = list(MOVES)
    weights = [config.mix_planner, config.mix_hint, config.mix_mover]
    out: list[tuple[list[Message], str]] = []
    while len(out) < n:
        puzzle = _train_puzzle(rng, game)
        kind = rng.choices(range(3), weights)[0]
        if kind == 1:  # hinted planner: mostly on the hinted path, where the hint's letter is the move
            pos = _position(rng, puzzle, 0.8)
        else:
            pos = _position(rng, puzzle, config.on_path)
        best = puzzle.optimal_moves(pos)
        right = rng.choice(best)
        if kind == 0:
            target = right if rng.random() >= config.noise else rng.choice(letters)
            out.append(([Message(role="user", content=planner_text(puzzle, pos))], target))
        elif kind == 1:
            hint = Message(role="system", content=HINT_PREFIX + puzzle.hint())
            path_move = _hint_move(puzzle, pos)
            target = path_move or right
            if rng.random() < config.hint_noise:
                target = rng.choice(letters)
            out.append(([hint, Message(role="user", content=planner_text(puzzle, pos))], target))
        else:
            # the proposal as a warm-started planner would make it: right, a random letter or none
            u = rng.random()
            plan = right if u < 0.6 else (None if u < 0.65 else rng.choice(letters))
            if rng.random() >= config.noise:
                target = right
            elif plan is not None and rng.random() < 0.5:
                target = plan  # follows the proposal, right or wrong
            else:
                target = rng.choice(letters)
            out.append(([Message(role="user", content=mover_text(puzzle, pos, plan))], target))
    return out


def _hint_move(puzzle, pos) -> str | None:
    """The hint's letter at `pos` (None off the hinted path)."""
    cur = puzzle.start
    for move in puzzle.path():
        if cur == pos:
            return move
        cur = puzzle.after(cur, move)
    return None


# -- playing the game with transformers (the build's own measurement) --------------------------


def play(model, tokenizer, puzzles: Sequence, temperature: float = 1.0, samples: int = 1, seed: int = 0, slack: int = 2, batch_size: int = 1024) -> dict[str, float]:
    """The team (planner then mover, one shared model) on `puzzles`, `samples` episodes each,
    sampled with transformers (plain temperature distribution; 0 = greedy) exactly as the
    workflow's environment plays them: team success and each agent's share of optimal moves."""
    from pipeline.models.sft import encode_messages_fast, generate_texts, seeded_sampling
    from pipeline.workflows.grid.game import GridEnv, MOVER, PLANNER

    envs = [GridEnv(p, p.shortest + slack) for p in puzzles for _ in range(samples)]
    good = {PLANNER: [0, 0], MOVER: [0, 0]}
    with seeded_sampling(model, seed):
        live = list(envs)
        while live:
            for agent in (PLANNER, MOVER):
                prompts = [pr for pr, _ in encode_messages_fast(tokenizer, [(e.observe(agent), "") for e in live])]
                texts = generate_texts(model, tokenizer, prompts, temperature, 4, batch_size)
                still = []
                for e, text in zip(live, texts):
                    res = e.step(agent, text)
                    good[agent][0] += res.reward
                    good[agent][1] += 1
                    if not res.done:
                        still.append(e)
                live = still
    return {
        "success": sum(e.team_reward() for e in envs) / len(envs),
        "planner_optimal": good[PLANNER][0] / max(1, good[PLANNER][1]),
        "mover_optimal": good[MOVER][0] / max(1, good[MOVER][1]),
    }


# -- the warm start ----------------------------------------------------------------------------


def grid_warm_start(model, tokenizer, game: GridGame, config: GridWarmStartConfig, log: Callable[[str], None] = print) -> dict:
    """Train `model` in place by SFT on the game's prompts for `config.steps` steps."""
    return staged_warm_start(model, tokenizer, game, config, grid_sft_examples, "grid", log)


def staged_warm_start(model, tokenizer, game, config, make_examples: Callable, label: str, log: Callable[[str], None] = print) -> dict:
    """SFT of `model` in place for `config.steps` steps on `make_examples(rng, n, game, config)`:
    right targets alone for the first `config.clean_steps` steps, then the configured share of
    wrong ones (`noise`, `hint_noise`), so sampling at T=1 stays imperfect; warm-up then cosine
    to `lr_final`. The grid's and Plan-Path's warm starts."""
    import torch

    from pipeline.models.sft import FastEncoder, sft_steps, warmup_cosine

    torch.manual_seed(config.seed)
    rng = random.Random(f"{label.replace('_', '-')}-warm-start:{config.seed}")
    FastEncoder(tokenizer).check(make_examples(random.Random(0), 16, game, config))
    lr_at = warmup_cosine(config.warmup_steps, config.steps, config.lr_final / config.lr)
    clean = replace(config, noise=0.0, hint_noise=0.0)

    def examples(step: int):
        return make_examples(rng, config.batch_size, game, clean if step <= config.clean_steps else config)

    t0 = time.perf_counter()
    loss_avg = math.nan
    for step, loss in sft_steps(model, tokenizer, examples, steps=config.steps, lr=config.lr, lr_lambda=lr_at):
        loss_avg = loss if math.isnan(loss_avg) else 0.95 * loss_avg + 0.05 * loss
        if step % 50 == 0 or step == config.steps:
            log(f"{label} warm start: step {step:4d}/{config.steps}  loss {loss_avg:.3f}  {time.perf_counter() - t0:5.1f}s")
    model.eval()
    return {"steps": config.steps, "seconds": time.perf_counter() - t0, "final_loss": loss_avg}


# -- build and cache ---------------------------------------------------------------------------

def _build_settings(model_config: ModelConfig, game: GridGame, warm: GridWarmStartConfig) -> dict:
    """What the grid model's cache key hashes (`pipeline.models.build.settings_key`)."""
    from pipeline.workflows.grid.game import MOVER_PREFIX, NO_PLAN, PLANNER_PREFIX

    warm_settings = asdict(warm)
    warm_settings.pop("threads", None)
    return {
        "version": GRID_BUILD_VERSION,
        "model": model_config.key(),
        "game": asdict(game),
        "warm_start": warm_settings,
        "prompts": [PLANNER_PREFIX, MOVER_PREFIX, NO_PLAN],
    }


def _key(model_config: ModelConfig, game: GridGame, warm: GridWarmStartConfig) -> str:
    return settings_key(_build_settings(model_config, game, warm))


def build_grid_model(
    cache_dir: str | Path | None = None,
    game: GridGame = GridGame(),
    warm: GridWarmStartConfig = GridWarmStartConfig(),
    model_config: ModelConfig | None = None,
    force: bool = False,
    log: Callable[[str], None] = print,
    measure: bool = True,
) -> Path:
    """Build the grid model (tokenizer, random Llama, warm start), measure its held-out team
    success (`measure`), and save it atomically under `<cache>/models/grid-<hash>`; an existing
    build of the same settings is reused unless `force`. Returns the model dir."""
    model_config = model_config or ModelConfig(seed=warm.seed)

    def build(folder: Path) -> dict:
        import torch

        t0 = time.perf_counter()
        tok, model = untrained_model(model_config, build_grid_tokenizer(model_config.max_position_embeddings), folder)
        log(f"grid model: {len(tok)} tokens, Llama {model_config.num_layers}x{model_config.hidden_size}, {count_parameters(model) / 1e6:.2f}M parameters")
        threads = torch.get_num_threads()
        if warm.threads:
            torch.set_num_threads(warm.threads)
        try:  # the held-out measurement too runs on the build's threads
            with torch.random.fork_rng(devices=[]):
                record = grid_warm_start(model, tok, game, warm, log=log)
            model.save_pretrained(str(folder), safe_serialization=True)
            info = {
                "build_version": GRID_BUILD_VERSION,
                "model_config": asdict(model_config),
                "game": asdict(game),
                "warm_start_config": asdict(warm),
                "warm_start": record,
                "parameters": count_parameters(model),
                "vocab_size": len(tok),
            }
            if measure:
                info.update(_heldout_success(model, tok, game))
                log(f"grid model ready in {time.perf_counter() - t0:.0f}s: held-out team success {info['heldout_t1']['success']:.1%} at T=1, "
                    f"{info['heldout_greedy']['success']:.1%} greedy")
        finally:
            torch.set_num_threads(threads)
        return info

    return cached_build(cache_dir, "grid", _build_settings(model_config, game, warm), build, what="the grid model", force=force, log=log)


def _heldout_success(model, tokenizer, game: GridGame) -> dict:
    """The build's measurement: the team on 200 held-out puzzles, at T=1 (two episodes each) and greedy."""
    from pipeline.workflows.grid.game import generate_puzzles

    heldout = generate_puzzles("heldout", 200, 20_261_122, game.size, game.walls, game.min_dist, game.max_dist, game.heldout_fraction)
    return {
        "heldout_t1": play(model, tokenizer, heldout, 1.0, samples=2, seed=1, slack=game.slack),
        "heldout_greedy": play(model, tokenizer, heldout, 0.0, samples=1, seed=1, slack=game.slack),
    }


def grid_model(cache_dir: str | Path | None = None, game: GridGame = GridGame(), seed: int = 0, scale: int = 1) -> Path:
    """The warm-started grid model dir for `game`: built on the first call, reused afterwards.
    `scale` > 1: the model `scale` times as deep (about `scale` times the parameters; the wide arm
    of a team of `scale` policies), a build of its own."""
    return build_grid_model(cache_dir, game, GridWarmStartConfig(seed=seed), model_config=scaled_model_config(seed, scale))
