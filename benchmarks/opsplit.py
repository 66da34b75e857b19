"""Where a profiled stage's operator time goes: torch.profiler's self CPU time summed into a few
named kinds (matmuls, attention, ...), the rest as "other".

Used by `vllm_cpu.py --profile` and `prefix.py --profile`. Self time is what each operator spent
outside the operators it called, so the kinds do not count anything twice; their sum is the
profiled operators' time, which leaves out the Python between them (and the profiler's own
cost, which lengthens a profiled run: time a run without the profiler for its seconds).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# operator names (as torch.profiler reports them) per kind; a name matches a kind when it
# contains one of the kind's strings
DECODE_KINDS: Mapping[str, Sequence[str]] = {
    "matmul": ("onednn_mm", "aten::mm", "aten::addmm", "aten::bmm"),
    "attention": ("cpu_attention", "cpu_attn", "kv_cache", "scaled_dot_product"),
    "sampling": ("gumbel", "_log_softmax", "aten::sort", "aten::topk", "multinomial"),
}
TRAIN_KINDS: Mapping[str, Sequence[str]] = {
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "onednn_mm"),
    "attention": ("scaled_dot_product", "flash_attention"),
    "casts": ("aten::copy_", "aten::_to_copy"),  # every copy, autocast's casts among them
}


def kind_of(name: str, kinds: Mapping[str, Sequence[str]]) -> str:
    for kind, needles in kinds.items():
        if any(n in name for n in needles):
            return kind
    return "other"


def split_seconds(events, kinds: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """Seconds of self CPU time per kind (and "other") over `events`, the profiler's
    `key_averages()` (anything with `.key` and `.self_cpu_time_total` in microseconds)."""
    out = {kind: 0.0 for kind in kinds} | {"other": 0.0}
    for e in events:
        out[kind_of(e.key, kinds)] += e.self_cpu_time_total / 1e6
    return out


def shares_line(seconds: Mapping[str, float]) -> str:
    """`matmul 3.39 s (46%), attention ...` over the kinds' total."""
    total = sum(seconds.values()) or 1.0
    return ", ".join(f"{k} {v:.2f} s ({100 * v / total:.0f}%)" for k, v in seconds.items())
