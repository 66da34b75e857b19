"""Dagster definitions of maxit: rounds of expert iteration as partitioned assets."""

from __future__ import annotations

import dagster as dg

defs = dg.Definitions(assets=[])
