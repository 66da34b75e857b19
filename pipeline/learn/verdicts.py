"""The Verifier's verdicts in training: which tasks may train it on yes/no replies, and its wrong
verdicts relabelled as right ones (`ViewConfig.relabel_verdicts`).
"""

from __future__ import annotations

import pyarrow as pa

from pipeline.config import ViewConfig
from pipeline.errors import ConfigError

__all__ = ["check_verdict_training", "relabel_verdicts"]


def check_verdict_training(task, config: ViewConfig) -> None:
    """Refuse `relabel_verdicts` / `verifier_replay` for a task whose Verifier answers the problem
    itself (`task.verdict_reads_solution`, verdict style "compare"): both train the Verifier on
    another row's reply for the right verdict, a yes/no reply such a Verifier never writes (for it
    the reply is an answer of that problem)."""
    if not getattr(task, "verdict_reads_solution", False):
        return
    for flag, on in (("--relabel-verdicts", config.relabel_verdicts), ("--verifier-replay", config.verifier_replay)):
        if on:
            raise ConfigError(f"{flag} trains the Verifier on yes/no replies, but this task's Verifier answers the problem itself "
                              "and its verdict is read by comparing answers (prompt verdict style 'compare'); drop the flag or use a yes/no verdict style")


def relabel_verdicts(table: pa.Table) -> tuple[pa.Table, int]:
    """`table` with every row whose parsable verdict was wrong (reward 0; math: the Verifier's)
    turned into a row of the right verdict: completion ids and logprobs of the most common
    completion among the same agent's rows whose verdict of that kind was right, reward 1, verdict flipped. A kind no row got right
    this round has no completion to take and its wrong rows stay as they are. Returns the table
    and the number of rows relabelled (see `ViewConfig.relabel_verdicts`)."""
    agents = table.column("agent_id").to_pylist()
    verdicts = table.column("verdict").to_pylist()
    rewards = table.column("reward").to_pylist()
    completions = table.column("completion_ids").to_pylist()
    logprobs = table.column("completion_logprobs").to_pylist()
    # per agent that gives verdicts (the rows with a parsed verdict), per verdict
    counts: dict[tuple[str, bool], dict[tuple, int]] = {}
    first: dict[tuple, int] = {}
    for i, (a, v, r) in enumerate(zip(agents, verdicts, rewards)):
        if v is not None and r is not None and r >= 1.0:
            key = tuple(completions[i])
            kind = counts.setdefault((a, v), {})
            kind[key] = kind.get(key, 0) + 1
            first.setdefault(key, i)
    canonical = {k: first[max(c, key=lambda t: (c[t], -first[t]))] for k, c in counts.items() if c}
    changed = [
        i for i, (a, v, r) in enumerate(zip(agents, verdicts, rewards))
        if v is not None and r is not None and r < 1.0 and (a, not v) in canonical
    ]
    if not changed:
        return table, 0
    for i in changed:
        src = canonical[(agents[i], not verdicts[i])]
        completions[i], logprobs[i] = completions[src], logprobs[src]
        verdicts[i], rewards[i] = not verdicts[i], 1.0
    for name, values in (("completion_ids", completions), ("completion_logprobs", logprobs), ("verdict", verdicts), ("reward", rewards)):
        idx = table.schema.get_field_index(name)
        table = table.set_column(idx, table.schema.field(idx), pa.array(values, type=table.schema.field(idx).type))
    return table, len(changed)
