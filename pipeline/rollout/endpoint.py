"""An OpenAI-compatible endpoint over maxit's samplers that records every call as a `steps` row.

A program written against the OpenAI chat API (`pipeline.workflows.program`) plays its episodes
through this endpoint: `POST /ep/<key>/v1/chat/completions` (and `/v1/completions`, `GET
/v1/models`), where `model` names an agent of the team, so its policy and engine, and `<key>` is
a per-episode token in the client's base URL that the program never sees as such. A streamed
request (`stream=True`) gets the same completion as server-sent events, in one chunk. The key
carries the episode's uid, strategy and sample index; the endpoint assigns each call its turn
(the agent's call count within the episode) and its step (the episode's call count), and
records:

- the prompt token ids exactly as the engine saw them: the request's messages rendered with the
  model's chat template (`encode_prompt`), with the hint of the `prompt_aug` strategy added to a
  hinted agent's messages (the training view removes it again);
- the completion token ids and their sampling logprobs verbatim, and the detokenized text, which
  is what the program receives;
- the seed (`request_seed` of the run seed, round, step and episode), so a program whose calls
  do not depend on timing draws the same samples again.

Sampling settings are the run's (temperature, each agent's completion budget), whatever the
request says, unless the endpoint is built with `request_sampling=True`.

Everything listens on 127.0.0.1 only, on a free port, from `start()` to `stop()` (the program
workflow opens it around one `run_rollouts` call: a round's rollouts, or its evaluation). Calls
from every running episode are sampled together: a batcher thread gathers the requests that
arrive while the engine is busy and sends them as one engine call per policy, each request with
its own seed (what a request draws does not depend on its batch).

A program is hostile input. A request the endpoint cannot serve (an unknown episode key, a call
after the episode returned, a model that names no agent, a body that is not a chat request) is
answered with an OpenAI-style error JSON (`{"error": {"message", "type", "param", "code"}}`) and
marks its episode failed (`EpisodeCalls.fail`): the episode's rows then get a null reward with
the first error in `reward_error`.

This module records the calls; the HTTP server is `pipeline.rollout.http_server`, the OpenAI wire
format `pipeline.rollout.openai_api`, the batcher `pipeline.rollout.batcher`.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from pipeline.errors import ConfigError
from pipeline.models.chat import encode_prompt
from pipeline.rollout.agent import Agent
from pipeline.rollout.batcher import Batcher
from pipeline.rollout.http_server import HOST, EndpointHandler, EndpointServer
from pipeline.rollout.openai_api import RequestError, chat_messages, completion_response, encode_text, json_body, stream_chunks
from pipeline.rollout.rows import Episode, Row
from pipeline.rollout.sampling import RolloutConfig, request_seed
from pipeline.types import Sampler

__all__ = ["Endpoint", "EpisodeCalls"]

log = logging.getLogger(__name__)


@dataclass
class EpisodeCalls:
    """One episode as the endpoint sees it: its record (`Episode`: problem, strategy, ids, rows,
    first error), its key, and the bookkeeping of its calls."""

    episode: Episode
    key: str
    open: bool = True
    """False once the program returned (or was abandoned): later calls are refused and mark it."""
    steps: int = 0
    """Calls assigned so far (the next call's `step`)."""
    turns: dict[str, int] = field(default_factory=dict)
    """agent_id -> its calls so far (the next call's `turn`)."""
    in_flight: int = 0
    """Calls being served now."""
    waited: float = 0.0
    """Seconds spent inside finished calls, and `in_flight_since` the start of the current ones:
    the program's own time is its wall time less these (`own_seconds`)."""
    in_flight_since: float | None = None
    started: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fail(self, message: str) -> None:
        """Mark the episode failed with `message`, unless it already failed (the first error is
        the one its rows carry)."""
        with self.lock:
            if self.episode.error is None:
                self.episode.error = message

    def own_seconds(self, now: float) -> float:
        """Seconds the program has run outside its calls to the endpoint (0 before it started)."""
        with self.lock:
            if self.started is None:
                return 0.0
            waiting = self.waited + (now - self.in_flight_since if self.in_flight_since is not None else 0.0)
            return now - self.started - waiting


class Endpoint:
    """The OpenAI-compatible endpoint of one `run_rollouts` call (see the module doc). Use it as a
    context manager, or `start()` and `stop()`; `open_episode` registers an episode and gives its
    key, `base_url(calls)` the URL its client gets."""

    def __init__(
        self,
        agents: Sequence[Agent],
        samplers: Mapping[str, Sampler],
        tokenizers: Mapping[str, Any],
        config: RolloutConfig,
        hinted: Sequence[str] = (),
        request_sampling: bool = False,
    ) -> None:
        self.agents = {a.agent_id: a for a in agents}
        missing = sorted({a.policy_id for a in agents} - set(samplers))
        if missing:
            raise ConfigError(f"endpoint: no sampler for policy id(s) {missing}; got {sorted(samplers)}")
        self.samplers = dict(samplers)
        self.tokenizers = dict(tokenizers)
        self._encoding = {pid: threading.Lock() for pid in self.tokenizers}
        self.config = config
        self.hinted = frozenset(hinted)
        self.request_sampling = request_sampling
        self.episodes: dict[str, EpisodeCalls] = {}
        self._server: EndpointServer | None = None
        self._thread: threading.Thread | None = None
        self._batcher: Batcher | None = None

    # -- life -------------------------------------------------------------------------------
    def start(self) -> "Endpoint":
        endpoint = self

        class Handler(EndpointHandler):
            owner = endpoint

        self._server = EndpointServer((HOST, 0), Handler)  # bound first: a failed bind leaves no batcher behind
        self._batcher = Batcher(self.samplers)
        self._batcher.start()
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True, name="maxit-endpoint")
        self._thread.start()
        log.info("endpoint listening on %s", self.url)
        return self

    def stop(self) -> None:
        """Stop listening (the port is released) and stop the batcher; every episode is closed."""
        for calls in self.episodes.values():
            with calls.lock:
                calls.open = False
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._batcher is not None:
            self._batcher.stop()
            self._batcher.join(timeout=60)
            self._batcher = None

    def __enter__(self) -> "Endpoint":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def address(self) -> tuple[str, int]:
        if self._server is None:
            raise RuntimeError("the endpoint is not running")
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}"

    # -- episodes -----------------------------------------------------------------------------
    def open_episode(self, episode: Episode) -> EpisodeCalls:
        key = secrets.token_urlsafe(12)
        calls = EpisodeCalls(episode, key)
        self.episodes[key] = calls
        return calls

    def base_url(self, calls: EpisodeCalls) -> str:
        """The base URL of the episode's OpenAI client (its key is a path prefix)."""
        return f"{self.url}/ep/{calls.key}/v1"

    def close_episode(self, calls: EpisodeCalls) -> None:
        with calls.lock:
            calls.open = False

    # -- serving ------------------------------------------------------------------------------
    def models(self) -> dict:
        return {"object": "list", "data": [{"id": a, "object": "model", "created": 0, "owned_by": "maxit"} for a in self.agents]}

    def serve(self, key: str, kind: str, body: bytes) -> dict:
        """The response to one completion request of the episode `key` (`kind` "chat" or
        "completions"), or a `RequestError`, which also marks the episode."""
        calls = self.episodes.get(key)
        if calls is None:
            raise RequestError(404, "unknown episode key in the URL (a client made for another episode or round)", "unknown_episode")
        try:
            return self._serve(calls, kind, body)
        except RequestError as err:
            calls.fail(f"request refused ({err.status} {err.code}): {err.message}")
            raise

    def _serve(self, calls: EpisodeCalls, kind: str, body: bytes) -> dict:
        with calls.lock:
            if not calls.open:
                raise RequestError(409, "a call came after the episode's program returned (or was stopped)", "episode_closed")
        request = json_body(body)
        agent = self._agent(request.get("model"))
        n = request.get("n", 1)
        if n not in (None, 1):
            raise RequestError(400, f"n must be 1 (one completion per call), got {n!r}", "unsupported", "n")
        if request.get("tools") or request.get("functions"):
            raise RequestError(400, "tools and functions are not supported: agents answer in text", "unsupported", "tools")
        e = calls.episode
        tok = self.tokenizers[agent.policy_id]
        if kind == "chat":
            messages = chat_messages(request.get("messages"))
            if agent.agent_id in self.hinted:
                messages = e.strategy.augment(messages, e.problem)
            with self._encoding[agent.policy_id]:  # a fast tokenizer is not safe across handler threads
                prompt_ids = encode_prompt(tok, messages)
        else:
            prompt = request.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1:
                prompt = prompt[0]
            if not isinstance(prompt, str):
                raise RequestError(400, "'prompt' must be one string", "invalid_prompt", "prompt")
            messages = []
            with self._encoding[agent.policy_id]:
                prompt_ids = encode_text(tok, prompt)
        if not prompt_ids:
            raise RequestError(400, "the prompt renders to no tokens", "invalid_prompt", "prompt" if kind != "chat" else "messages")
        temperature, max_tokens = self._sampling(request, agent.agent_id)
        with calls.lock:
            if not calls.open:
                raise RequestError(409, "a call came after the episode's program returned (or was stopped)", "episode_closed")
            step, turn, parent = calls.steps, calls.turns.get(agent.agent_id, 0), e.parent
            calls.steps += 1
            calls.turns[agent.agent_id] = turn + 1
            step_id = f"{e.traj_uid}-{agent.agent_id}-t{turn}"
            e.parent = step_id
            if calls.in_flight == 0:
                calls.in_flight_since = time.monotonic()
            calls.in_flight += 1
        seed = request_seed(self.config.seed, self.config.round, step, e.traj_uid)
        sampler = self.samplers[agent.policy_id]
        try:
            sample = self._batcher.submit(agent.policy_id, prompt_ids, temperature, max_tokens, seed).result()
        except Exception as exc:  # noqa: BLE001 - the engine's refusal (a prompt past its context...) is this call's
            raise RequestError(500, f"the engine could not sample this call: {type(exc).__name__}: {exc}", "engine_error", kind="server_error") from None
        finally:
            with calls.lock:
                calls.in_flight -= 1
                if calls.in_flight == 0 and calls.in_flight_since is not None:
                    calls.waited += time.monotonic() - calls.in_flight_since
                    calls.in_flight_since = None
        if len(sample.token_ids) != len(sample.logprobs):
            raise RequestError(500, f"engine {sampler.engine!r} returned {len(sample.token_ids)} token ids but {len(sample.logprobs)} logprobs", "engine_error", kind="server_error")
        row = Row(
            step_id=step_id, strategy=e.strategy.strategy_id, uid=e.problem.uid, traj_uid=e.traj_uid, sample_idx=e.sample_idx,
            agent_id=agent.agent_id, policy_id=agent.policy_id, turn=turn, step=step, parent_node_id=parent, messages=messages,
            prompt_ids=prompt_ids, sample=sample, model_version=sampler.model_version, engine=sampler.engine, seed=seed,
            temperature=temperature,
        )
        with calls.lock:
            e.rows.append(row)
        out = completion_response(kind, step_id, agent.agent_id, sample, len(prompt_ids))
        if request.get("stream"):
            include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
            out = {"stream": stream_chunks(kind, out, include_usage)}
        return out

    def _agent(self, model: object) -> Agent:
        if not isinstance(model, str) or model not in self.agents:
            raise RequestError(
                404, f"The model {model!r} does not exist: a model names an agent of the team, one of {sorted(self.agents)}", "model_not_found", "model"
            )
        return self.agents[model]

    def _sampling(self, request: dict, agent_id: str) -> tuple[float, int]:
        """(temperature, max_tokens) of a call: the run's, or the request's where the run allows it."""
        temperature, max_tokens = float(self.config.temperature), int(self.config.max_tokens_for(agent_id))
        if not self.request_sampling:
            return temperature, max_tokens
        t = request.get("temperature")
        if t is not None:
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= 2:
                raise RequestError(400, f"temperature must be a number in [0, 2], got {t!r}", "invalid_value", "temperature")
            temperature = float(t)
        m = request.get("max_completion_tokens", request.get("max_tokens"))
        if m is not None:
            if isinstance(m, bool) or not isinstance(m, int) or m < 1:
                raise RequestError(400, f"max_tokens must be an integer >= 1, got {m!r}", "invalid_value", "max_tokens")
            max_tokens = m
        return temperature, max_tokens
