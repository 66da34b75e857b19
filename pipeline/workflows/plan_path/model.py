"""The Plan-Path game's embedded model: the grid model's tokenizer and architecture (a 4 x 128
Llama with a character-level tokenizer, `pipeline.workflows.grid.model`), warm-started in code on
the Plan-Path prompts, cached under `<cache>/models/plan_path-<hash of the settings>`.

The grid's own model cannot serve: it was trained to answer one move letter, and here every call
is a whole path, and the plan agent reads a call and its output that the grid's prompts never
show.

- Warm start: SFT on the game's own prompts (`pipeline.workflows.plan_path.game`) at random
  positions of train-split puzzles, every target a path: the tool's prompt (which the single
  agent shares) -> a shortest path from the position (ties broken at random), sometimes under the
  prompt_aug hint (-> the hinted path from there); the plan agent's prompt, after a call that is
  a shortest path, a corrupted one or not a path at all, run as the environment runs it ->
  the part of the call that ran when its trial reached the goal, else a shortest path of its own.
  The first `clean_steps` train on right targets only; after them a share `noise` of the
  targets is wrong on purpose (a corrupted path; for the plan agent, half of those the call
  copied whatever its output said), so sampling at T=1 is imperfect and rejection sampling on
  the right paths has room to sharpen it. Fixed step count, one torch thread (the grid model's
  reason: two threads spin-wait on a shared machine), deterministic from the seed.
- `plan_path_model()` builds once, then reuses the cached build; the build writes
  `maxit_build.json` with its settings, the SFT record and the held-out success it measured
  (`play`: the team and the single agent, at T=1 and greedy, with transformers' sampling).
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

from pipeline.errors import ConfigError
from pipeline.models.build import ModelConfig, cached_build, count_parameters, scaled_model_config, untrained_model
from pipeline.types import Message

__all__ = ["PlanPathGame", "PlanPathWarmStartConfig", "plan_path_sft_examples", "plan_path_model", "build_plan_path_model", "play", "PLAN_PATH_BUILD_VERSION"]

PLAN_PATH_BUILD_VERSION = 1
"""Bump when the build code changes what it produces, so old cached models are not reused."""
MEASURE_TURNS = 2
"""Turns of the build's own measurement (the workflow's default)."""


@dataclass(frozen=True)
class PlanPathGame:
    """The maze options the model is warm-started on (`PlanPathWorkflow`'s)."""

    size: int = 4
    walls: int = 3
    min_dist: int = 2
    max_dist: int = 6
    heldout_fraction: float = 0.2


@dataclass(frozen=True)
class PlanPathWarmStartConfig:
    """Settings of the Plan-Path model's warm-start SFT."""

    steps: int = 400
    """Optimizer steps in all (fixed: the whole warm start is deterministic from the seed)."""
    clean_steps: int = 300
    """The first steps train on right targets only (the grid model's finding: clean first, a 1M
    model learns to read mazes early; noisy from the start, its onset came late and varied)."""
    batch_size: int = 128
    lr: float = 3e-3
    """Peak AdamW learning rate (linear warmup, then cosine to `lr_final`)."""
    lr_final: float = 3e-4
    warmup_steps: int = 30
    noise: float = 0.5
    """Share of the targets that are wrong on purpose after `clean_steps`."""
    hint_noise: float = 0.15
    """The same share for hinted tool examples."""
    on_path: float = 0.6
    """Share of examples at a cell of the start's shortest path (else any reachable cell)."""
    good_call: float = 0.5
    """Share of the plan agent's examples whose call is a shortest path (else corrupted; a few
    are not paths at all)."""
    mix_tool: float = 0.4
    mix_hint: float = 0.1
    mix_plan: float = 0.5
    seed: int = 0
    threads: int | None = 1
    """torch threads of the build (restored afterwards; None: leave torch's setting); not part of
    the build's key."""

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1:
            raise ConfigError("plan_path warm start: steps and batch_size must be >= 1")
        if not 0 <= self.clean_steps <= self.steps:
            raise ConfigError(f"plan_path warm start: clean_steps must be in [0, steps], got {self.clean_steps}")
        for name in ("noise", "hint_noise", "on_path", "good_call"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(f"plan_path warm start: {name} must be in [0, 1], got {getattr(self, name)}")


# -- SFT examples ------------------------------------------------------------------------------


def _train_puzzle(rng: random.Random, game: PlanPathGame):
    from pipeline.workflows.grid.game import puzzle_split, random_puzzle

    while True:
        p = random_puzzle(rng, game.size, game.walls)
        if p is not None and game.min_dist <= p.shortest <= game.max_dist and puzzle_split(p, game.heldout_fraction) == "train":
            return p


def _path_cells(puzzle) -> list[tuple[int, int]]:
    cells = [puzzle.start]
    for move in puzzle.path()[:-1]:
        cells.append(puzzle.after(cells[-1], move))
    return cells


def _position(rng: random.Random, puzzle, on_path: float) -> tuple[int, int]:
    if rng.random() < on_path:
        return rng.choice(_path_cells(puzzle))
    cells = [(r, c) for r in range(puzzle.height) for c in range(puzzle.width) if puzzle.dist[r][c] not in (None, 0)]
    return rng.choice(cells)


def shortest_from(rng: random.Random, puzzle, pos: tuple[int, int]) -> str:
    """A shortest path from `pos` to the goal, each tie between optimal moves broken at random."""
    out = []
    while pos != puzzle.goal:
        move = rng.choice(puzzle.optimal_moves(pos))
        out.append(move)
        pos = puzzle.after(pos, move)
    return "".join(out)


def corrupt(rng: random.Random, path: str) -> str:
    """A path a little wrong: one letter changed, the last dropped, one added, or random letters."""
    letters = "UDLR"
    kind = rng.randrange(4)
    if kind == 0:
        i = rng.randrange(len(path))
        return path[:i] + rng.choice([m for m in letters if m != path[i]]) + path[i + 1 :]
    if kind == 1 and len(path) > 1:
        return path[:-1]
    if kind == 2:
        i = rng.randrange(len(path) + 1)
        return path[:i] + rng.choice(letters) + path[i:]
    return "".join(rng.choice(letters) for _ in range(rng.randint(1, len(path) + 1)))


def _hinted_path(rng: random.Random, puzzle, pos) -> str:
    """The hint's path from `pos` (the rest of `puzzle.path()`), else a shortest path."""
    cur, path = puzzle.start, puzzle.path()
    for i, move in enumerate(path):
        if cur == pos:
            return path[i:]
        cur = puzzle.after(cur, move)
    return shortest_from(rng, puzzle, pos)


def plan_path_sft_examples(rng: random.Random, n: int, game: PlanPathGame, config: PlanPathWarmStartConfig) -> list[tuple[list[Message], str]]:
    """`n` (messages, target path) pairs of the mix in `config` on train-split puzzles."""
    from pipeline.strategies import HINT_PREFIX
    from pipeline.workflows.plan_path.game import plan_text, run_path, tool_text

    weights = [config.mix_tool, config.mix_hint, config.mix_plan]
    out: list[tuple[list[Message], str]] = []
    while len(out) < n:
        puzzle = _train_puzzle(rng, game)
        kind = rng.choices(range(3), weights)[0]
        pos = _position(rng, puzzle, 0.8 if kind == 1 else config.on_path)
        right = shortest_from(rng, puzzle, pos)
        if kind == 0:
            target = right if rng.random() >= config.noise else corrupt(rng, right)
            out.append(([Message(role="user", content=tool_text(puzzle, pos))], target))
        elif kind == 1:
            hint = Message(role="system", content=HINT_PREFIX + puzzle.hint())
            target = _hinted_path(rng, puzzle, pos)
            if rng.random() < config.hint_noise:
                target = corrupt(rng, target)
            out.append(([hint, Message(role="user", content=tool_text(puzzle, pos))], target))
        else:
            u = rng.random()
            call = shortest_from(rng, puzzle, pos) if u < config.good_call else ("x" if u > 0.95 else corrupt(rng, right))
            trial = run_path(puzzle, pos, call)
            target = trial.ran if trial.reached else right
            if rng.random() < config.noise:
                target = trial.moves if trial.moves is not None and rng.random() < 0.5 else corrupt(rng, right)
            out.append(([Message(role="user", content=plan_text(puzzle, pos, trial))], target))
    return out


# -- playing the game with transformers (the build's own measurement) --------------------------


def play(model, tokenizer, puzzles: Sequence, agents: Sequence[str], temperature: float = 1.0, samples: int = 1, seed: int = 0,
         turns: int = MEASURE_TURNS, batch_size: int = 1024, single: bool = False) -> dict[str, float]:
    """`agents` (the team: tool, plan; or, `single`, the plan agent's seat alone without the tool) on `puzzles`, `samples` episodes
    each, one shared model sampled with transformers (plain temperature distribution; 0 =
    greedy) exactly as the workflow's environment plays them: the team success and each agent's
    mean local reward."""
    from pipeline.models.sft import encode_messages_fast, generate_texts, seeded_sampling
    from pipeline.workflows.plan_path.game import MAX_PATH, PlanPathEnv

    envs = [PlanPathEnv(p, turns, single=single) for p in puzzles for _ in range(samples)]
    rewards = {a: [0.0, 0] for a in agents}
    with seeded_sampling(model, seed):
        live = list(envs)
        while live:
            for agent in agents:
                prompts = [pr for pr, _ in encode_messages_fast(tokenizer, [(e.observe(agent), "") for e in live])]
                texts = generate_texts(model, tokenizer, prompts, temperature, MAX_PATH + 1, batch_size)
                still = []
                for e, text in zip(live, texts):
                    res = e.step(agent, text)
                    rewards[agent][0] += res.reward
                    rewards[agent][1] += 1
                    if not res.done:
                        still.append(e)
                live = still
    out = {"success": sum(e.team_reward() for e in envs) / len(envs)}
    out.update({f"{a}_reward": s / max(1, k) for a, (s, k) in rewards.items()})
    return out


# -- the warm start ----------------------------------------------------------------------------


def plan_path_warm_start(model, tokenizer, game: PlanPathGame, config: PlanPathWarmStartConfig, log: Callable[[str], None] = print) -> dict:
    """Train `model` in place by SFT on the game's prompts for `config.steps` steps (the grid's
    staged warm start on Plan-Path's examples)."""
    from pipeline.workflows.grid.model import staged_warm_start

    return staged_warm_start(model, tokenizer, game, config, plan_path_sft_examples, "plan_path", log)


# -- build and cache ---------------------------------------------------------------------------


def _build_settings(model_config: ModelConfig, game: PlanPathGame, warm: PlanPathWarmStartConfig) -> dict:
    """What the model's cache key hashes (`pipeline.models.build.settings_key`)."""
    from pipeline.workflows.plan_path.game import BAD_CALL, CALL_PREFIX, MAX_PATH, PLAN_PREFIX, TOOL_PREFIX

    warm_settings = asdict(warm)
    warm_settings.pop("threads", None)
    return {
        "version": PLAN_PATH_BUILD_VERSION,
        "model": model_config.key(),
        "game": asdict(game),
        "warm_start": warm_settings,
        "prompts": [TOOL_PREFIX, PLAN_PREFIX, CALL_PREFIX, BAD_CALL, MAX_PATH],
    }


def build_plan_path_model(
    cache_dir: str | Path | None = None,
    game: PlanPathGame = PlanPathGame(),
    warm: PlanPathWarmStartConfig = PlanPathWarmStartConfig(),
    model_config: ModelConfig | None = None,
    force: bool = False,
    log: Callable[[str], None] = print,
    measure: bool = True,
) -> Path:
    """Build the Plan-Path model (the grid's tokenizer, a random Llama, the warm start), measure
    its held-out success (`measure`), and save it atomically under `<cache>/models/plan_path-<hash>`;
    an existing build of the same settings is reused unless `force`. Returns the model dir."""
    from pipeline.workflows.grid.model import build_grid_tokenizer

    model_config = model_config or ModelConfig(seed=warm.seed)

    def build(folder: Path) -> dict:
        import torch

        t0 = time.perf_counter()
        tok, model = untrained_model(model_config, build_grid_tokenizer(model_config.max_position_embeddings), folder)
        log(f"plan_path model: {len(tok)} tokens, Llama {model_config.num_layers}x{model_config.hidden_size}, {count_parameters(model) / 1e6:.2f}M parameters")
        threads = torch.get_num_threads()
        if warm.threads:
            torch.set_num_threads(warm.threads)
        try:
            with torch.random.fork_rng(devices=[]):
                record = plan_path_warm_start(model, tok, game, warm, log=log)
            model.save_pretrained(str(folder), safe_serialization=True)
            info = {
                "build_version": PLAN_PATH_BUILD_VERSION,
                "model_config": asdict(model_config),
                "game": asdict(game),
                "warm_start_config": asdict(warm),
                "warm_start": record,
                "parameters": count_parameters(model),
                "vocab_size": len(tok),
            }
            if measure:
                info.update(_heldout_success(model, tok, game))
                log(f"plan_path model ready in {time.perf_counter() - t0:.0f}s: held-out success at T=1 "
                    f"{info['team_t1']['success']:.1%} (team), {info['single_t1']['success']:.1%} (single agent); greedy "
                    f"{info['team_greedy']['success']:.1%}, {info['single_greedy']['success']:.1%}")
        finally:
            torch.set_num_threads(threads)
        return info

    return cached_build(cache_dir, "plan_path", _build_settings(model_config, game, warm), build, what="the plan_path model", force=force, log=log)


def _heldout_success(model, tokenizer, game: PlanPathGame) -> dict:
    """The build's measurement: the team and the single agent on 200 held-out puzzles, at T=1 (two
    episodes each) and greedy."""
    from pipeline.workflows.grid.game import generate_puzzles
    from pipeline.workflows.plan_path.game import PLAN, TOOL

    heldout = generate_puzzles("heldout", 200, 20_261_122, game.size, game.walls, game.min_dist, game.max_dist, game.heldout_fraction)
    return {
        "team_t1": play(model, tokenizer, heldout, (TOOL, PLAN), 1.0, samples=2, seed=1),
        "team_greedy": play(model, tokenizer, heldout, (TOOL, PLAN), 0.0, samples=1, seed=1),
        "single_t1": play(model, tokenizer, heldout, (PLAN,), 1.0, samples=2, seed=1, single=True),
        "single_greedy": play(model, tokenizer, heldout, (PLAN,), 0.0, samples=1, seed=1, single=True),
    }


def plan_path_model(cache_dir: str | Path | None = None, game: PlanPathGame = PlanPathGame(), seed: int = 0, scale: int = 1) -> Path:
    """The warm-started Plan-Path model dir for `game`: built on the first call, reused afterwards.
    `scale` > 1: the model `scale` times as deep (about `scale` times the parameters; the wide arm
    of a team of `scale` policies), a build of its own; the same warm start."""
    return build_plan_path_model(cache_dir, game, PlanPathWarmStartConfig(seed=seed), model_config=scaled_model_config(seed, scale))
