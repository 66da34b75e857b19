"""The verdict: does a trained team pay against its arms (`maxit baselines --arm ...`)? Per store,
the team against each trained arm played on the same held-out problems and draws (a difference
inside two standard errors is "no difference"); over a team's seeds, against the seeds' spread."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import polars as pl

from pipeline.run.experiment_record import complete_rounds, is_store
from pipeline.store import BASE_ROUND

__all__ = ["ArmResult", "PLAYED_ARMS", "arm_results", "label_over_stores", "played_arms", "verdict_lines", "verdict_across"]

PLAYED_ARMS = {
    "single": "the trained single agent, 1 call",
    "single_best_of_k": "the trained single agent, best-of-{m} vote at the team's calls",
    "single_self_refine": "the trained single agent, self-refine x{m} at the team's calls",
    "protocol": "the team's protocol played by one trained agent",
    "separate": "the team, a trained policy per agent",
    "shared": "the team, one trained shared policy",
    "wide": "the trained single agent with the team's parameters, 1 call",
    "wide_best_of_k": "the trained single agent with the team's parameters, best-of-{m} vote at the team's calls",
    "wide_self_refine": "the trained single agent with the team's parameters, self-refine x{m} at the team's calls",
}
"""What the verdict calls each played row of a trained arm's `baselines` table."""


@dataclass(frozen=True)
class ArmResult:
    """One row the verdict compares: the team, or a trained arm, played as the baselines are."""

    arm: str
    """The row's `baseline` ("team", "single", "single_best_of_k", "protocol", ...)."""
    label: str
    """What the verdict calls it."""
    round: int
    """The round whose checkpoints played it (an arm's: its last complete round)."""
    success: float
    n: int
    """Episodes played (held-out problems x samples)."""
    calls: float | None
    """Model calls per episode."""


def played_arms(sibling: Path, arm: str) -> list[ArmResult]:
    """The played rows of arm `arm`'s sibling store (its `baselines` table, last round), success known."""
    from pipeline.run.arms import read_baselines

    table = read_baselines(sibling)
    if table is None:
        return []
    done = complete_rounds(sibling)
    table = table.filter(pl.col("round") == (done[-1] if done else table["round"].max()))
    out = []
    for (baseline,), part in table.group_by("baseline", maintain_order=True):
        value = {r["metric"]: r["value"] for r in part.iter_rows(named=True)}
        if value.get("success") is None or not baseline.startswith(arm):
            continue
        label = PLAYED_ARMS.get(baseline, baseline).format(m=int(part["calls_per_call"][0]))
        out.append(ArmResult(baseline, label, int(part["round"][0]), float(value["success"]), int(part["n"][0]), value.get("calls")))
    return out


def arm_results(store: str | Path) -> tuple[dict[int, ArmResult], list[ArmResult]]:
    """(round -> the trained team played as the baselines are at that round, the trained arms
    played at their last rounds): every row the verdict compares, from the store's `baselines`
    table and its arms' sibling stores (`<store>-<arm>`)."""
    from pipeline.run.arms import ARMS, arm_store, read_baselines

    table = read_baselines(store)
    team: dict[int, ArmResult] = {}
    if table is not None:
        for (round_,), part in table.filter((pl.col("baseline") == "team") & (pl.col("round") != BASE_ROUND)).group_by("round", maintain_order=True):
            value = {r["metric"]: r["value"] for r in part.iter_rows(named=True)}
            if value.get("success") is not None:
                team[int(round_)] = ArmResult("team", "the team", int(round_), float(value["success"]), int(part["n"][0]), value.get("calls"))
    arms = []
    for arm in ARMS:
        sibling = arm_store(store, arm)
        if is_store(sibling):
            arms += played_arms(sibling, arm)
    return team, arms


def _se(result: ArmResult) -> float:
    p = result.success
    return math.sqrt(max(p * (1 - p), 0.0) / max(result.n, 1))


def _judge(team: ArmResult, arm: ArmResult) -> tuple[str, str]:
    """("pays" | "does not pay" | "no difference", the line's figures) for one store: a difference
    within two standard errors of it (the two success rates' errors combined) is no difference."""
    diff = 100 * (team.success - arm.success)
    two_se = 200 * math.sqrt(_se(team) ** 2 + _se(arm) ** 2)
    word = "no difference" if abs(diff) <= two_se else "pays" if diff > 0 else "does not pay"
    calls = f", {team.calls:.2f} against {arm.calls:.2f} calls" if team.calls is not None and arm.calls is not None else ""
    return word, f"{100 * team.success:.1f} against {100 * arm.success:.1f}, {diff:+.1f} points (2 se = {two_se:.1f}{calls})"


def verdict_lines(store: str | Path, name: str | None = None) -> list[str]:
    """The verdict of one store: against which trained arm (each at the team's training rows,
    played on the team's held-out problems and draws) the trained team pays, does not pay, or
    makes no difference (within two standard errors), by how much; a line saying how to train the
    arms when it has none."""
    from pipeline.run.arms import ARMS, arm_store

    name = name or str(store)
    team, arms = arm_results(store)
    unplayed = [arm for arm in ARMS if complete_rounds(arm_store(store, arm)) and not any(a.arm.startswith(arm) for a in arms)]
    later = [f"arm {arm} is trained but not played yet (maxit baselines --store {name} --arm {arm}: its rounds are kept)" for arm in unplayed]
    if not arms:
        return [f"verdict of store {name}: no trained arm to judge the team against yet: maxit baselines --store {name} --arm single --arm protocol "
                "--arm separate (the team's shared policy; --arm shared for a team of separate policies)", *later]
    lines = [f"verdict of store {name} (success of the trained team and of each trained arm at the team's training rows, played on the team's "
             "held-out problems and draws; within 2 standard errors is no difference):"]
    words: dict[str, list[str]] = {"pays": [], "does not pay": [], "no difference": []}
    for arm in arms:
        mine = team.get(arm.round)
        if mine is None:
            lines.append(f"- against {arm.label} (round {arm.round}): no verdict: the team has no played row of round {arm.round} "
                         f"(maxit baselines --store {name} --force)")
            continue
        if mine.n != arm.n:
            lines.append(f"- against {arm.label} (round {arm.round}): no verdict: the team was played on {mine.n} episodes, the arm on {arm.n} "
                         f"(maxit baselines --store {name} --arm {arm.arm.split('_')[0]} --eval-problems N plays both on N held-out problems)")
            continue
        word, figures = _judge(mine, arm)
        words[word].append(arm.label)
        lines.append(f"- against {arm.label}: {'the team ' + word if word != 'no difference' else 'no difference'}: {figures}; round {arm.round}")
    lines += [f"- {line}" for line in later]
    lines.append("in short: " + "; ".join(f"{'the team ' + w if w != 'no difference' else w} against {', '.join(who)}" for w, who in words.items() if who))
    return lines


def verdict_across(stores: Sequence[str | Path], names: Sequence[str] | None = None) -> list[str]:
    """The verdict over a team's seeds (one store each): for each trained arm every store has,
    the team's success and the arm's over the stores, mean (min..max), and the difference; "no
    difference" when the two seed ranges overlap (a difference inside the seed spread), else
    whether the team pays and by how much (the mean difference, its min..max over the seeds)."""
    names = list(names) if names is not None else [str(s) for s in stores]
    per_store = [arm_results(s) for s in stores]
    lines = [f"verdict over {len(stores)} stores ({', '.join(names)}): success in percent, mean (min..max) over the stores; "
             "a difference inside the seed spread (the ranges overlap) is no difference:"]
    seen: dict[str, list[str]] = {}
    for _team, arms in per_store:
        for a in arms:
            seen.setdefault(a.arm, []).append(a.label)
    labels = {key: label_over_stores(found) for key, found in seen.items()}
    judged = 0
    for key, label in labels.items():
        pairs, episodes = [], None
        for (team, arms), name in zip(per_store, names):
            arm = next((a for a in arms if a.arm == key), None)
            if arm is None or arm.round not in team:
                pairs = None
                lines.append(f"- against {label}: no verdict: store {name} has no played {'team' if arm is not None else 'arm'} row")
                break
            if team[arm.round].n != arm.n or (episodes is not None and arm.n != episodes):
                pairs = None
                lines.append(f"- against {label}: no verdict: store {name} has it played on {arm.n} episodes, its team on {team[arm.round].n}"
                             f"{'' if episodes is None else f', the first store on {episodes}'} (maxit baselines --eval-problems N plays every one on N)")
                break
            episodes = arm.n if episodes is None else episodes
            pairs.append((team[arm.round].success, arm.success))
        if pairs is None:
            continue
        judged += 1
        t, a = [100 * x for x, _ in pairs], [100 * y for _, y in pairs]
        d = [x - y for x, y in zip(t, a)]
        overlap = min(t) <= max(a) and min(a) <= max(t)
        word = "no difference" if overlap or len(pairs) < 2 else "the team pays" if sum(d) > 0 else "the team does not pay"
        if len(pairs) < 2:
            word = "no verdict over seeds (one store)"
        lines.append(f"- against {label}: {word}: the team {_spread(t)} against {_spread(a)}, difference {_spread(d, signed=True)}")
    if not judged and not labels:
        lines.append("- no trained arm in these stores (maxit baselines --store S --arm single --arm protocol --arm separate)")
    return lines


def label_over_stores(labels: list[str]) -> str:
    """The label of one arm over the stores that have it. A vote's or self-refine's k follows each
    store's team calls, so it may differ by store: then k, and each store's count."""
    if len(set(labels)) == 1:
        return labels[0]
    counts = [re.search(r"(?:best-of-|self-refine x)(\d+)", label) for label in labels]
    if any(c is None for c in counts):
        raise ValueError(f"one arm with different labels by store: {sorted(set(labels))}")
    first = counts[0]
    general = labels[0][:first.start(1)] + "k" + labels[0][first.end(1):]
    return f"{general} (k = {', '.join(c.group(1) for c in counts)} by store)"


def _spread(values: Sequence[float], signed: bool = False) -> str:
    f = "+.1f" if signed else ".1f"
    return f"{sum(values) / len(values):{f}} ({min(values):{f}}..{max(values):{f}})"

