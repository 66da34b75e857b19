"""The endpoint's batcher: the requests of every running episode (`pipeline.rollout.endpoint`),
gathered while the engine is busy and sent as one engine call per policy, each request with its
own seed (what a request draws does not depend on its batch).
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Mapping

from pipeline.types import GenerateCall, Sampler, generate_calls

__all__ = ["Batcher", "BatchedRequest", "GATHER_SECONDS", "GATHER_MAX_SECONDS"]

GATHER_SECONDS = 0.005
"""The batcher waits this long after the latest request for another before it samples (the
requests of episodes that call at the same moment go out together)."""

GATHER_MAX_SECONDS = 0.05
"""...and never longer than this after the first request of a batch."""


@dataclass(frozen=True)
class BatchedRequest:
    """One request waiting for its sample; its future gets the sample or the engine's error."""

    policy_id: str
    prompt_ids: list[int]
    temperature: float
    max_tokens: int
    seed: int
    future: Future


class Batcher(threading.Thread):
    """Samples the requests of every episode: takes what is queued (waiting `GATHER_SECONDS` for
    more), sends one engine call per policy, and resolves each request's future with its one
    sample (or the engine's error)."""

    def __init__(self, samplers: Mapping[str, Sampler]) -> None:
        super().__init__(daemon=True, name="maxit-endpoint-batcher")
        self.samplers = samplers
        self.queue: queue.Queue[BatchedRequest | None] = queue.Queue()

    def submit(self, policy_id: str, prompt_ids: list[int], temperature: float, max_tokens: int, seed: int) -> Future:
        future: Future = Future()
        self.queue.put(BatchedRequest(policy_id, prompt_ids, temperature, max_tokens, seed, future))
        return future

    def stop(self) -> None:
        self.queue.put(None)

    def run(self) -> None:
        while True:
            first = self.queue.get()
            if first is None:
                return
            batch, stopping = [first], False
            deadline = time.monotonic() + GATHER_MAX_SECONDS
            while time.monotonic() < deadline:
                try:
                    item = self.queue.get(timeout=GATHER_SECONDS)
                except queue.Empty:
                    break
                if item is None:
                    stopping = True
                    break
                batch.append(item)
            self._sample(batch)
            if stopping:
                return

    def _sample(self, batch: list[BatchedRequest]) -> None:
        try:
            by_policy: dict[str, list[BatchedRequest]] = {}
            for req in batch:
                by_policy.setdefault(req.policy_id, []).append(req)
            for policy_id, reqs in by_policy.items():
                self._sample_policy(policy_id, reqs)
        except BaseException as exc:  # noqa: BLE001 - the batcher must outlive any call: no request may wait forever
            for r in batch:
                if not r.future.done():
                    r.future.set_exception(exc)

    def _sample_policy(self, policy_id: str, reqs: list[BatchedRequest]) -> None:
        groups: dict[tuple[float, int], list[BatchedRequest]] = {}
        for req in reqs:
            groups.setdefault((req.temperature, req.max_tokens), []).append(req)
        calls = [GenerateCall([r.prompt_ids for r in rs], 1, t, m, [r.seed for r in rs]) for (t, m), rs in groups.items()]
        try:
            out = generate_calls(self.samplers[policy_id], calls)
        except Exception as exc:  # noqa: BLE001 - the engine refused the batch
            if len(reqs) == 1:
                reqs[0].future.set_exception(exc)
                return
            # one request's fault (a prompt past the context) must not fail the episodes batched
            # with it: each is asked again alone and answers with its own result or error
            for r in reqs:
                self._sample_policy(policy_id, [r])
            return
        for rs, drawn in zip(groups.values(), out):
            for r, samples in zip(rs, drawn):
                if samples:
                    r.future.set_result(samples[0])
                else:
                    r.future.set_exception(RuntimeError("the engine returned no sample for this request"))
