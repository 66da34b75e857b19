"""Errors maxit raises on bad input. Each names what is wrong: the column, the row ids, the flag."""

from __future__ import annotations

from schemas import SchemaError

__all__ = ["MaxitError", "ConfigError", "DataError", "SchemaError"]


class MaxitError(Exception):
    """Base of maxit's own errors."""


class ConfigError(MaxitError, ValueError):
    """A configuration value is invalid; the message names the field and what it accepts."""


class DataError(MaxitError, ValueError):
    """Table contents are unusable (NaN rewards, empty groups...); the message names the rows."""
