"""The transformers rollout engine (the fallback where vLLM is not installed).

Sampling is `model.generate` over left-padded batches with `do_sample=True, top_k=0, top_p=1.0`
(and every other logits processor neutralized), so the distribution sampled is exactly
softmax(logits / T). The logprob of each chosen token is read from the processed scores of that
same step (`output_scores`), i.e. log_softmax(logits / T), the distribution actually sampled.
Completion ids are the generated ids themselves, cut after the first EOS; they are never
decoded and re-encoded. `temperature=0` means greedy decoding; its logprobs are then those of
the T=1 distribution (log_softmax(logits)).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from pipeline.models.loading import left_padded
from pipeline.types import Sample

from .config import EngineConfig, check_generate_args, model_parameters, sample_seeds

__all__ = ["HFSampler"]


class HFSampler:
    """`Sampler` on transformers `generate`."""

    engine = "hf"

    def __init__(self, model_dir: str | Path, config: EngineConfig | None = None) -> None:
        import torch

        self.config = config or EngineConfig()
        if self.config.threads:
            torch.set_num_threads(self.config.threads)
        self._torch = torch
        self.tokenizer = None
        self.model = None
        self.load_checkpoint(model_dir)

    # -- weights ----------------------------------------------------------------------------
    def load_checkpoint(self, model_dir: str | Path) -> None:
        from pipeline.models import load_model, load_tokenizer, weights_hash

        model_dir = Path(model_dir)
        # the checkpoint's own tokenizer (another model may bring another vocabulary and EOS)
        self.tokenizer = load_tokenizer(model_dir)
        # "auto": bf16 for a real model on a CPU with native bf16, float32 for the tiny default
        self.dtype = self.config.resolved_dtype(model_parameters(model_dir))
        self.model = load_model(model_dir, dtype=getattr(self._torch, self.dtype))
        self.model.eval()
        self.model_dir = model_dir
        self._version = weights_hash(model_dir)
        gen = self.model.generation_config
        eos = gen.eos_token_id if gen.eos_token_id is not None else self.tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        self.eos_ids.add(self.tokenizer.eos_token_id)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.eos_ids)

    @property
    def model_version(self) -> str:
        return self._version

    # -- sampling ---------------------------------------------------------------------------
    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        n: int,
        temperature: float,
        max_tokens: int,
        seed: int | Sequence[int],
    ) -> list[list[Sample]]:
        """n samples per prompt; all prompts x n run as left-padded batches of `config.max_batch`
        sequences. The same (prompts, n, temperature, max_tokens, seed) gives the same samples.
        With one seed per prompt, each prompt's n samples are drawn as their own batch under
        their own seed, so they do not depend on the other prompts of the call (slower: one
        `generate` per prompt)."""
        torch = self._torch
        prompts = check_generate_args(prompt_ids, n, temperature, max_tokens)
        if isinstance(seed, int) and not isinstance(seed, bool):
            groups = [(seed, [list(p) for p in prompts for _ in range(n)])]
        else:
            seeds = sample_seeds(seed, len(prompts), 1)
            groups = [(s[0], [list(p)] * n) for s, p in zip(seeds, prompts)]
        results: list[Sample] = []
        with torch.random.fork_rng(devices=[]), torch.inference_mode():
            for group_seed, rows in groups:
                torch.manual_seed(group_seed)
                for start in range(0, len(rows), self.config.max_batch):
                    results += self._generate_batch(rows[start : start + self.config.max_batch], temperature, max_tokens)
        return [results[i * n : (i + 1) * n] for i in range(len(prompt_ids))]

    def _generate_batch(self, rows: list[list[int]], temperature: float, max_tokens: int) -> list[Sample]:
        torch = self._torch
        ids, mask = left_padded(rows, self.pad_id)
        greedy = temperature == 0
        sampling = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=float(temperature))
        out = self.model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_tokens,
            eos_token_id=sorted(self.eos_ids),
            pad_token_id=self.pad_id,
            top_k=0,
            top_p=1.0,
            min_p=None,
            typical_p=1.0,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            min_new_tokens=0,
            output_scores=True,
            output_logits=greedy,
            return_dict_in_generate=True,
            **sampling,
        )
        gen = out.sequences[:, ids.shape[1] :]
        steps = out.logits if greedy else out.scores  # greedy: raw logits = the T=1 distribution
        logp = torch.stack([torch.log_softmax(s.float(), dim=-1) for s in steps], dim=1)
        chosen = logp.gather(-1, gen.unsqueeze(-1)).squeeze(-1)
        samples = []
        gen_l, chosen_l = gen.tolist(), chosen.tolist()
        token_lists = []
        for toks, lps in zip(gen_l, chosen_l):
            end = next((k + 1 for k, t in enumerate(toks) if t in self.eos_ids), None)
            finish = "stop" if end is not None else "length"
            end = end if end is not None else len(toks)
            token_lists.append((toks[:end], lps[:end], finish))
        texts = self.tokenizer.batch_decode([t for t, _, _ in token_lists], skip_special_tokens=True)
        for (toks, lps, finish), text in zip(token_lists, texts):
            samples.append(Sample(token_ids=toks, logprobs=lps, text=text, finish_reason=finish))
        return samples

    def close(self) -> None:
        from .env import return_freed_memory

        self.model = None
        return_freed_memory()
