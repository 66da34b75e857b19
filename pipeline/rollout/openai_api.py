"""The OpenAI API as the endpoint (`pipeline.rollout.endpoint`) speaks it: a refused request
(`RequestError`, answered with OpenAI's error JSON), a request body read and its messages checked,
a raw prompt tokenized as the engine sees it, and a completion answered whole or as the chunks of a
stream.
"""

from __future__ import annotations

import json
import time

from pipeline.rollout.contract import check_messages
from pipeline.types import Message, Sample

__all__ = ["RequestError", "json_body", "encode_text", "chat_messages", "completion_response", "stream_chunks"]


class RequestError(Exception):
    """A request the endpoint refuses: its HTTP status and OpenAI-style error fields."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.kind = status, message, code, param, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}



def json_body(body: bytes) -> dict:
    """A request body as the JSON object it must be."""
    try:
        request = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RequestError(400, f"the request body is not JSON ({err})", "invalid_json") from None
    if not isinstance(request, dict):
        raise RequestError(400, f"the request body must be a JSON object, got {type(request).__name__}", "invalid_json")
    return request


def encode_text(tokenizer, text: str) -> list[int]:
    """The token ids of a raw completion prompt, as the engine sees it (no special tokens added)."""
    try:
        ids = tokenizer.encode(text, add_special_tokens=False)
    except TypeError:  # a tokenizer without the option adds none
        ids = tokenizer.encode(text)
    return [int(i) for i in ids]


def chat_messages(raw: object) -> list[Message]:
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


def completion_response(kind: str, step_id: str, model: str, sample: Sample, n_prompt: int) -> dict:
    """The OpenAI response of one sampled completion (`kind` "chat" or "completions")."""
    usage = {"prompt_tokens": n_prompt, "completion_tokens": len(sample.token_ids), "total_tokens": n_prompt + len(sample.token_ids)}
    created = int(time.time())
    if kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": sample.text}, "finish_reason": sample.finish_reason, "logprobs": None}
        return {"id": f"chatcmpl-{step_id}", "object": "chat.completion", "created": created, "model": model, "choices": [choice], "usage": usage}
    choice = {"index": 0, "text": sample.text, "finish_reason": sample.finish_reason, "logprobs": None}
    return {"id": f"cmpl-{step_id}", "object": "text_completion", "created": created, "model": model, "choices": [choice], "usage": usage}


def stream_chunks(kind: str, full: dict, include_usage: bool) -> list[dict]:
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
