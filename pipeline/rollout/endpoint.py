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
"""

from __future__ import annotations

import json
import logging
import queue
import secrets
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Mapping, Sequence

from pipeline.errors import ConfigError
from pipeline.models.chat import encode_prompt
from pipeline.rollout.agent import Agent
from pipeline.rollout.contract import check_messages
from pipeline.rollout.rows import Episode, Row
from pipeline.rollout.sampling import RolloutConfig, request_seed
from pipeline.types import GenerateCall, Message, Sample, Sampler, generate_calls

__all__ = ["HOST", "Endpoint", "EpisodeCalls", "RequestError"]

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
"""The endpoint's one address: loopback, so nothing off this machine can call it."""

GATHER_SECONDS = 0.005
"""The batcher waits this long after the latest request for another before it samples (the
requests of episodes that call at the same moment go out together)."""

GATHER_MAX_SECONDS = 0.05
"""...and never longer than this after the first request of a batch."""


class RequestError(Exception):
    """A request the endpoint refuses: its HTTP status and OpenAI-style error fields."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.kind = status, message, code, param, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


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


@dataclass(frozen=True)
class _Request:
    policy_id: str
    prompt_ids: list[int]
    temperature: float
    max_tokens: int
    seed: int
    future: Future


class _Batcher(threading.Thread):
    """Samples the requests of every episode: takes what is queued (waiting `GATHER_SECONDS` for
    more), sends one engine call per policy, and resolves each request's future with its one
    sample (or the engine's error)."""

    def __init__(self, samplers: Mapping[str, Sampler]) -> None:
        super().__init__(daemon=True, name="maxit-endpoint-batcher")
        self.samplers = samplers
        self.queue: queue.Queue[_Request | None] = queue.Queue()

    def submit(self, policy_id: str, prompt_ids: list[int], temperature: float, max_tokens: int, seed: int) -> Future:
        future: Future = Future()
        self.queue.put(_Request(policy_id, prompt_ids, temperature, max_tokens, seed, future))
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

    def _sample(self, batch: list[_Request]) -> None:
        try:
            by_policy: dict[str, list[_Request]] = {}
            for req in batch:
                by_policy.setdefault(req.policy_id, []).append(req)
            for policy_id, reqs in by_policy.items():
                self._sample_policy(policy_id, reqs)
        except BaseException as exc:  # noqa: BLE001 - the batcher must outlive any call: no request may wait forever
            for r in batch:
                if not r.future.done():
                    r.future.set_exception(exc)

    def _sample_policy(self, policy_id: str, reqs: list[_Request]) -> None:
        groups: dict[tuple[float, int], list[_Request]] = {}
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
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._batcher: _Batcher | None = None

    # -- life -------------------------------------------------------------------------------
    def start(self) -> "Endpoint":
        endpoint = self

        class Handler(_Handler):
            owner = endpoint

        self._server = _Server((HOST, 0), Handler)  # bound first: a failed bind leaves no batcher behind
        self._batcher = _Batcher(self.samplers)
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
        request = _json_body(body)
        agent = self._agent(request.get("model"))
        n = request.get("n", 1)
        if n not in (None, 1):
            raise RequestError(400, f"n must be 1 (one completion per call), got {n!r}", "unsupported", "n")
        if request.get("tools") or request.get("functions"):
            raise RequestError(400, "tools and functions are not supported: agents answer in text", "unsupported", "tools")
        e = calls.episode
        tok = self.tokenizers[agent.policy_id]
        if kind == "chat":
            messages = _chat_messages(request.get("messages"))
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
                prompt_ids = _encode_text(tok, prompt)
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
        out = _response(kind, step_id, agent.agent_id, sample, len(prompt_ids))
        if request.get("stream"):
            include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
            out = {"stream": _chunks(kind, out, include_usage)}
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


def _json_body(body: bytes) -> dict:
    try:
        request = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RequestError(400, f"the request body is not JSON ({err})", "invalid_json") from None
    if not isinstance(request, dict):
        raise RequestError(400, f"the request body must be a JSON object, got {type(request).__name__}", "invalid_json")
    return request


def _encode_text(tokenizer, text: str) -> list[int]:
    """The token ids of a raw completion prompt, as the engine sees it (no special tokens added)."""
    try:
        ids = tokenizer.encode(text, add_special_tokens=False)
    except TypeError:  # a tokenizer without the option adds none
        ids = tokenizer.encode(text)
    return [int(i) for i in ids]


def _chat_messages(raw: object) -> list[Message]:
    """A request's messages as chat messages: content a string or a list of text parts; the
    roles system (or developer), user and assistant."""
    if not isinstance(raw, list) or not raw:
        raise RequestError(400, "'messages' must be a non-empty list", "invalid_messages", "messages")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise RequestError(400, f"messages[{i}] is not an object", "invalid_messages", "messages")
        content = m.get("content")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
                raise RequestError(400, f"messages[{i}].content holds a part that is not text", "invalid_messages", "messages")
            content = "".join(p["text"] for p in content)
        role = "system" if m.get("role") == "developer" else m.get("role")
        out.append({"role": role, "content": content})
    try:
        return check_messages(out, "the request")
    except ValueError as err:
        raise RequestError(400, str(err).replace("the request returned", "the request holds"), "invalid_messages", "messages") from None


def _response(kind: str, step_id: str, model: str, sample: Sample, n_prompt: int) -> dict:
    usage = {"prompt_tokens": n_prompt, "completion_tokens": len(sample.token_ids), "total_tokens": n_prompt + len(sample.token_ids)}
    created = int(time.time())
    if kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": sample.text}, "finish_reason": sample.finish_reason, "logprobs": None}
        return {"id": f"chatcmpl-{step_id}", "object": "chat.completion", "created": created, "model": model, "choices": [choice], "usage": usage}
    choice = {"index": 0, "text": sample.text, "finish_reason": sample.finish_reason, "logprobs": None}
    return {"id": f"cmpl-{step_id}", "object": "text_completion", "created": created, "model": model, "choices": [choice], "usage": usage}


def _chunks(kind: str, full: dict, include_usage: bool) -> list[dict]:
    """A response as the chunks of a stream (`stream=True`): the whole completion in one
    chunk (it is sampled whole), then its finish reason, then the usage when asked for."""
    choice = full["choices"][0]
    head = {k: full[k] for k in ("id", "created", "model")}
    if kind == "chat":
        head["object"] = "chat.completion.chunk"
        first = {"index": 0, "delta": {"role": "assistant", "content": choice["message"]["content"]}, "finish_reason": None, "logprobs": None}
        last = {"index": 0, "delta": {}, "finish_reason": choice["finish_reason"], "logprobs": None}
    else:
        head["object"] = "text_completion"
        first = {"index": 0, "text": choice["text"], "finish_reason": None, "logprobs": None}
        last = {"index": 0, "text": "", "finish_reason": choice["finish_reason"], "logprobs": None}
    chunks = [{**head, "choices": [first]}, {**head, "choices": [last]}]
    if include_usage:
        chunks.append({**head, "choices": [], "usage": full["usage"]})
    return chunks


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024
    """Every running episode may connect at once (http.server's default backlog is 5: the rest
    would be refused)."""


class _Handler(BaseHTTPRequestHandler):
    owner: Endpoint
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
        log.debug("endpoint: " + format, *args)

    def _route(self) -> tuple[str | None, str]:
        """(episode key, the path after /v1/) of /ep/<key>/v1/<rest>; (None, rest) of /v1/<rest>."""
        path = self.path.split("?", 1)[0]
        parts = [p for p in path.split("/") if p]
        if len(parts) >= 3 and parts[0] == "ep" and parts[2] == "v1":
            return parts[1], "/".join(parts[3:])
        if parts and parts[0] == "v1":
            return None, "/".join(parts[1:])
        return None, path

    def _send(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        _key, rest = self._route()
        if rest == "models":
            self._send(200, self.owner.models())
        else:
            self._send(404, RequestError(404, f"no such route: GET {self.path}", "not_found").body())

    def do_POST(self) -> None:  # noqa: N802
        key, rest = self._route()
        kinds = {"chat/completions": "chat", "completions": "completions"}
        raw = (self.headers.get("Content-Length") or "0").strip()
        if not raw.isdigit():
            # the body's end is unknown: answer and drop the connection, whose next bytes cannot be parsed
            self.close_connection = True
            calls = self.owner.episodes.get(key or "")
            if calls is not None:
                calls.fail(f"a request with a bad Content-Length header {raw[:40]!r}")
            self._send(400, RequestError(400, f"bad Content-Length header {raw[:40]!r}: a non-negative integer", "invalid_request").body())
            return
        length = int(raw)
        body = self.rfile.read(length) if length > 0 else b""
        try:
            if rest not in kinds:
                raise RequestError(404, f"no such route: POST {self.path} (the endpoint serves /v1/chat/completions and /v1/completions)", "not_found")
            if key is None:
                raise RequestError(404, "no episode key: use the client the program was given (its base URL holds the key)", "unknown_episode")
            payload = self.owner.serve(key, kinds[rest], body)
        except RequestError as err:
            self._send(err.status, err.body())
            return
        except Exception as exc:  # noqa: BLE001 - a bug here must answer, not hang the client
            log.exception("endpoint: request failed")
            calls = self.owner.episodes.get(key or "")
            if calls is not None:
                calls.fail(f"the endpoint failed on a request: {type(exc).__name__}: {exc}")
            self._send(500, RequestError(500, f"{type(exc).__name__}: {exc}", "internal_error", kind="server_error").body())
            return
        if "stream" in payload:
            self._send_stream(payload["stream"])
        else:
            self._send(200, payload)

    def _send_stream(self, chunks: list[dict]) -> None:
        data = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
