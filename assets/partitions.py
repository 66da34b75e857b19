"""Rounds are dynamic partitions ("0", "1", ...): a run adds the next round when it starts it.

Dagster rejects a partition depending on its own previous partition unless time-partitioned, so
round r finds round r-1's checkpoint through the policy registry resource, not the asset graph."""

import dagster as dg

rounds = dg.DynamicPartitionsDefinition(name="rounds")


def round_of(context) -> int:
    """The round of a step's partition (`context.partition_key`)."""
    return round_from_key(context.partition_key)


def round_from_key(key: str) -> int:
    """The round a partition key names: "0", "1", ...; any other key is an error naming it."""
    try:
        r = int(key)
    except ValueError:
        raise dg.Failure(f"partition key {key!r} is not a round number (0, 1, 2, ...)") from None
    if r < 0:
        raise dg.Failure(f"partition key {key!r}: rounds start at 0 (round -1 is the starting checkpoint's evaluation)")
    return r
