"""Reading a reply: the number it ends with, and a Verifier's verdict.

Below the task classes and the prompt templates, which both read replies with these
(`pipeline.tasks.base` and `pipeline.tasks.prompts` re-export them under their old names).
"""

from __future__ import annotations

import re

__all__ = ["parse_number", "last_number", "numbers_equal", "parse_verdict", "parse_marked_verdict", "parse_compared_verdict"]

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def parse_number(text: str | None) -> float | None:
    """The number `text` spells ("1,234", "$5", "42.0", " -7 "), or None if it is not exactly one number."""
    if text is None:
        return None
    s = text.strip().replace(",", "").replace("$", "").rstrip(".").strip()
    if not re.fullmatch(r"-?\d+(?:\.\d+)?", s):
        return None
    return float(s)


def last_number(text: str) -> float | None:
    """The last number written in `text` (commas allowed as thousands separators), or None.

    A GSM8K-style "#### 42" marker wins over any other number when present."""
    marked = re.search(r"####\s*(" + _NUMBER.pattern + ")", text)
    if marked:
        return parse_number(marked.group(1))
    found = _NUMBER.findall(text)
    return parse_number(found[-1]) if found else None


def numbers_equal(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(a), abs(b))


def parse_verdict(text: str) -> bool | None:
    """"yes..." -> True, "no..." -> False (case and surrounding spaces/punctuation ignored), else None."""
    words = re.findall(r"[a-z]+", text.lower())
    if not words:
        return None
    if words[0] == "yes":
        return True
    if words[0] == "no":
        return False
    return None


_MARKER = re.compile(r"verdict[\W_]{0,6}(yes|no)\b", re.IGNORECASE)


def parse_marked_verdict(text: str) -> bool | None:
    """The last "Verdict: yes|no" in `text` (case, markdown stars and the colon are free:
    "**Verdict:** No", "verdict - yes"); without one, a bare yes/no: the reply's first word, else
    its last non-empty line when that line is only "yes"/"no" (punctuation aside); else None."""
    found = _MARKER.findall(text)
    if found:
        return found[-1].lower() == "yes"
    first = parse_verdict(text)
    if first is not None:
        return first
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    if lines:
        words = re.findall(r"[a-z]+", lines[-1].lower())
        if words in (["yes"], ["no"]):
            return words[0] == "yes"
    return None


def parse_compared_verdict(text: str, solution: str | None) -> bool | None:
    """Whether the Verifier's own answer (its reply's "#### x", else its last number) equals the
    judged solution's; None when the reply holds no number (unparsable). A solution without a
    number is never approved."""
    own = last_number(text)
    if own is None:
        return None
    proposed = last_number(solution or "")
    return proposed is not None and numbers_equal(own, proposed)
