"""OpenSpiel behind a thin AEC-shaped adapter: the only module of maxit that imports `pyspiel`.

Why pyspiel directly and not PettingZoo's AEC loop over it (shimmy's OpenSpielCompatibilityV0):
a maxit `Env` is copied by the tree strategy at every candidate, and pyspiel's `State.clone()` is
an exact, cheap copy, where the shimmy wrapper holds gym spaces and its own RNG for chance nodes;
chance outcomes must come from the problem's own seed (a problem is a dealt instance); and the text
the agents read is pyspiel's `observation_string(player)` either way. `Table` keeps the AEC shape
(`agent_selection` = the player to move, `last` = its observation and legal actions, `step`
applies one action, `rewards` at the end), so a PettingZoo environment could stand behind it.

Without the `games` extra installed, `load_game` is one `ConfigError` line naming it.
"""

from __future__ import annotations

import random
from functools import lru_cache

from pipeline.errors import ConfigError

__all__ = ["Table", "load_game", "solved_value", "best_moves", "EXTRA"]

EXTRA = "games"
"""The pyproject extra that installs OpenSpiel (pip install 'maxit[games]')."""


def _pyspiel():
    try:
        import pyspiel
    except ImportError:
        raise ConfigError(f"the game workflows need OpenSpiel: install the {EXTRA!r} extra (pip install 'maxit[{EXTRA}]', or scripts/setup.sh)") from None
    return pyspiel


@lru_cache(maxsize=None)
def load_game(name: str):
    """The pyspiel game `name` (one load per process); an unknown name is a `ConfigError`."""
    pyspiel = _pyspiel()
    try:
        return pyspiel.load_game(name)
    except pyspiel.SpielError as err:
        raise ConfigError(f"OpenSpiel has no game {name!r} ({err})") from None


class Table:
    """One game in play: a pyspiel state with its chance outcomes drawn from `seed`, in the AEC
    shape. Players are 0..n-1; chance nodes are resolved as soon as they come up."""

    __slots__ = ("game_name", "state", "rng")

    def __init__(self, game_name: str, seed: int | str, state=None, rng: random.Random | None = None) -> None:
        self.game_name = game_name
        self.state = state if state is not None else load_game(game_name).new_initial_state()
        self.rng = rng if rng is not None else random.Random(f"table:{game_name}:{seed}")
        self._chance()

    def clone(self) -> "Table":
        rng = random.Random()
        rng.setstate(self.rng.getstate())
        return Table(self.game_name, 0, self.state.clone(), rng)

    def _chance(self) -> None:
        while self.state.is_chance_node():
            actions, probs = zip(*self.state.chance_outcomes())
            self.state.apply_action(self.rng.choices(actions, probs)[0])

    @property
    def done(self) -> bool:
        return self.state.is_terminal()

    @property
    def agent_selection(self) -> int:
        """The player to move (negative once the game is over)."""
        return self.state.current_player()

    def observation(self, player: int) -> str:
        return self.state.observation_string(player)

    def legal(self) -> list[int]:
        return list(self.state.legal_actions())

    def action_text(self, action: int) -> str:
        return self.state.action_to_string(self.state.current_player(), action)

    def step(self, action: int) -> None:
        """Apply the mover's action (it must be legal: callers check `legal()` first)."""
        self.state.apply_action(action)
        self._chance()

    def rewards(self) -> list[float]:
        """Each player's utility (the game's returns; 0 for every player before the end)."""
        return list(self.state.returns())

    def history(self) -> list[int]:
        return list(self.state.history())


def solved_value(table: Table, player: int) -> float:
    """`player`'s utility of the position under optimal play by every player from here (exact
    minimax over the game tree, memoised on the position): a two-player zero-sum game without
    chance nodes past the deal, small enough to solve (tic-tac-toe: 5,478 positions)."""
    v0 = _minimax0(table.game_name, table.state)
    return v0 if player == 0 else -v0


def best_moves(table: Table) -> list[int]:
    """The mover's legal moves whose minimax result (`solved_value`) is the best it can get."""
    me = table.agent_selection
    scored = []
    for a in table.legal():
        child = table.clone()
        child.step(a)
        scored.append((solved_value(child, me), a))
    top = max(v for v, _ in scored)
    return [a for v, a in scored if v == top]


_VALUES: dict[tuple[str, str], float] = {}
"""(game, position and player to move) -> player 0's minimax value."""


def _minimax0(game_name: str, state) -> float:
    key = (game_name, str(state) + f"|{state.current_player()}")
    hit = _VALUES.get(key)
    if hit is not None:
        return hit
    if state.is_terminal():
        value = float(state.returns()[0])
    else:
        if state.is_chance_node():
            raise ConfigError(f"solved_value: game {game_name!r} has chance nodes in play; it cannot be solved by minimax")
        children = []
        for action in state.legal_actions():
            child = state.clone()
            child.apply_action(action)
            children.append(_minimax0(game_name, child))
        value = max(children) if state.current_player() == 0 else min(children)
    _VALUES[key] = value
    return value
