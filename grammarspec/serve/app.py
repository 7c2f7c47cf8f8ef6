"""The HTTP side: a Starlette app speaking OpenAI's Chat Completions, served by uvicorn.

``POST /v1/chat/completions`` (JSON, or server-sent events with ``stream=true``),
``GET /v1/models``, ``GET /health`` (engine alive; with the key, or on a server
without one, its counters and prefix-cache statistics).

Before a request reaches the loop (:mod:`grammarspec.serve.guard`, then here):
with an API key, every route but ``/health`` needs ``Authorization: Bearer
<key>`` (401); a body over ``max_body_bytes`` is a 413 before it is read whole;
the body is checked (:mod:`grammarspec.serve.protocol`); messages longer than
``max_prompt_chars`` characters are a 400 before the tokenizer sees them
(:mod:`grammarspec.serve.limits`); then the request is prepared
(:meth:`Engine.prepare`, in a worker thread: chat template, tokens, grammar).
A refused request is answered in OpenAI's error shape, its advice in words a
client can act on (:func:`~grammarspec.serve.advice.client_words`), and never
touches the others.  A client that disconnects cancels its rows.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from grammarspec.serve.advice import client_words
from grammarspec.serve.engine import Choice, Engine, Job
from grammarspec.serve.guard import DEFAULT_MAX_BODY_MB, ApiKey, middleware
from grammarspec.serve.limits import check_prompt_chars, derived_max_prompt_chars
from grammarspec.serve.protocol import RequestError, error_body, parse_request

__all__ = ["create_app", "serve", "AUTO"]

#: ``max_prompt_chars="auto"``: derived from the model's context and the vocabulary (:mod:`.limits`).
AUTO = "auto"


def _stats(choice: Choice) -> dict[str, Any]:
    """grammarspec's statistics for one choice (the ``grammarspec`` key of an answer)."""
    assert choice.row is not None
    s = choice.row.stats
    return {
        "index": choice.index,
        "tokens_per_target_pass": round(s.accepted_per_forward, 3),
        "target_forwards": s.target_forwards,
        "prompt_passes": s.prompt_passes,
        "forced_tokens": s.forced_tokens,
        "proposed": s.proposed,
        "accepted": s.accepted,
        "grammar_backend": s.grammar_backend or None,
        "valid": s.valid,
        "schema_errors": s.schema_errors,
        "unenforced_keywords": s.unenforced_keywords,
    }


def _usage(job: Job) -> dict[str, Any]:
    completion = sum(len(c.tokens) for c in job.choices)
    return {
        "prompt_tokens": len(job.prompt),
        "completion_tokens": completion,
        "total_tokens": len(job.prompt) + completion,
        "prompt_tokens_details": {"cached_tokens": job.reused_tokens},
    }


def _ours(job: Job, engine: Engine) -> dict[str, Any]:
    return {
        "choices": [_stats(c) for c in job.choices],
        "prefix_reused_tokens": job.reused_tokens,
        "time_to_first_token": job.first_token_seconds,
        "assistant": job.request.assistant,
        "prefix_cache": engine.prefix.as_dict(),
    }


def _error(e: RequestError) -> JSONResponse:
    body = e.body()
    body["error"]["message"] = client_words(body["error"]["message"])
    return JSONResponse(body, status_code=e.status)


def _server_error(message: str) -> dict[str, Any]:
    return error_body(client_words(message), kind="server_error")


def _read_json(raw: bytes) -> Any:
    """The body's JSON value; :class:`RequestError` for a body that is not JSON."""
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:  # json.JSONDecodeError is a ValueError
        raise RequestError(f"the request body is not valid JSON: {e}", code="invalid_json") from None
    except RecursionError:
        raise RequestError("the request body nests arrays or objects too deeply", code="invalid_json") from None


def create_app(
    engine: Engine,
    model_name: str,
    *,
    api_key: str | None = None,
    max_body_bytes: int = int(DEFAULT_MAX_BODY_MB * 2**20),
    max_prompt_chars: int | str | None = AUTO,
) -> Starlette:
    """The ASGI app serving ``engine`` under the model name ``model_name``.

    ``api_key``: the key every route but ``/health`` needs (``None``: an open
    server).  ``max_body_bytes``: the largest body read (413 past it).
    ``max_prompt_chars``: the most characters of message text tokenized (400
    past it); :data:`AUTO` derives it from the context and the vocabulary,
    ``None`` sets no limit.
    """
    key = ApiKey(api_key) if api_key is not None else None
    if max_prompt_chars == AUTO:
        max_prompt_chars = derived_max_prompt_chars(engine.tokenizer, engine.context)
    if isinstance(max_prompt_chars, str) or (max_prompt_chars is not None and max_prompt_chars < 1):
        raise ValueError(f"max_prompt_chars must be a positive integer, {AUTO!r} or None, got {max_prompt_chars!r}")
    prompt_limit: int | None = max_prompt_chars

    async def models(request: Request) -> Response:
        return JSONResponse(
            {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "grammarspec"}]}
        )

    async def health(request: Request) -> Response:
        alive = engine.healthy and engine._thread.is_alive()
        body: dict[str, Any] = {"status": "ok" if alive else "down"}
        if key is None or key.allows(request.headers):  # the details are for key holders
            body.update(counters=dict(engine.counters), prefix_cache=engine.prefix.as_dict())
        return JSONResponse(body, status_code=200 if alive else 503)

    async def chat(request: Request) -> Response:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        def emit(event: tuple[str, Any]) -> None:  # on the engine thread
            loop.call_soon_threadsafe(events.put_nowait, event)

        try:
            try:
                parsed = parse_request(_read_json(await request.body()), model_name)
            except RecursionError:
                raise RequestError("the request body nests arrays or objects too deeply", code="invalid_json") from None
            check_prompt_chars(parsed, prompt_limit, engine.context)
            job = await run_in_threadpool(engine.prepare, parsed, emit)
            engine.submit(job)
        except RequestError as e:
            return _error(e)
        if parsed.stream:
            return StreamingResponse(_stream(job, events, engine, model_name), media_type="text/event-stream")
        return await _answer(request, job, events, engine, model_name)

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ],
        middleware=middleware(api_key=api_key, max_body_bytes=max_body_bytes),
    )


async def _answer(request: Request, job: Job, events: asyncio.Queue, engine: Engine, model_name: str) -> Response:
    """Wait for every choice (cancelling the job if the client goes away); one chat.completion object."""
    done: dict[int, tuple[dict[str, Any], str]] = {}
    while len(done) < len(job.choices):
        try:
            kind, value = await asyncio.wait_for(events.get(), timeout=0.5)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                engine.cancel(job)
                return Response(status_code=499)
            continue
        if kind == "error":
            return JSONResponse(_server_error(value), status_code=500)
        if kind == "choice":
            choice, message, finish = value
            done[choice.index] = (message, finish)
    choices = [
        {"index": i, "message": done[i][0], "finish_reason": done[i][1], "logprobs": None}
        for i in range(len(job.choices))
    ]
    return JSONResponse(
        {
            "id": job.id,
            "object": "chat.completion",
            "created": job.created,
            "model": model_name,
            "choices": choices,
            "usage": _usage(job),
            "grammarspec": _ours(job, engine),
        }
    )


def _chunk(job: Job, model_name: str, choices: list[dict[str, Any]], **extra: Any) -> str:
    body = {
        "id": job.id,
        "object": "chat.completion.chunk",
        "created": job.created,
        "model": model_name,
        "choices": choices,
        **extra,
    }
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


async def _stream(job: Job, events: asyncio.Queue, engine: Engine, model_name: str) -> AsyncIterator[str]:
    """Server-sent events: a role delta, content or tool-call deltas as generated, the finishes, ``[DONE]``.

    With ``stream_options.include_usage`` a last chunk with ``choices: []``
    carries the usage (and every chunk before it ``usage: null``), as OpenAI
    sends it.  grammarspec's statistics ride on that usage chunk, or without
    it on the last chunk that has choices (the last finish).
    """
    include_usage = job.request.include_usage
    extra: dict[str, Any] = {"usage": None} if include_usage else {}
    finished = 0
    try:
        for i in range(len(job.choices)):
            yield _chunk(
                job,
                model_name,
                [{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
                **extra,
            )
        while finished < len(job.choices):
            kind, value = await events.get()
            if kind == "error":
                yield f"data: {json.dumps(_server_error(value))}\n\n"
                return
            if kind == "delta":
                index, text = value
                yield _chunk(
                    job, model_name, [{"index": index, "delta": {"content": text}, "finish_reason": None}], **extra
                )
            elif kind == "tool_calls":
                index, deltas = value
                yield _chunk(
                    job, model_name, [{"index": index, "delta": {"tool_calls": deltas}, "finish_reason": None}], **extra
                )
            elif kind == "choice":
                choice, message, finish = value
                finished += 1
                calls = message.get("tool_calls") or []
                # a reply that began as a call but was cut short keeps what was sent of the call
                rest = "" if calls or choice.calls.sent else (message.get("content") or "")[choice.sent :]
                if rest:
                    yield _chunk(
                        job,
                        model_name,
                        [{"index": choice.index, "delta": {"content": rest}, "finish_reason": None}],
                        **extra,
                    )
                deltas = choice.calls.finish(calls)
                if deltas:
                    yield _chunk(
                        job,
                        model_name,
                        [{"index": choice.index, "delta": {"tool_calls": deltas}, "finish_reason": None}],
                        **extra,
                    )
                ours = {"grammarspec": _ours(job, engine)} if finished == len(job.choices) and not include_usage else {}
                yield _chunk(
                    job, model_name, [{"index": choice.index, "delta": {}, "finish_reason": finish}], **extra, **ours
                )
        if include_usage:
            yield _chunk(job, model_name, [], usage=_usage(job), grammarspec=_ours(job, engine))
        yield "data: [DONE]\n\n"
    finally:
        if finished < len(job.choices):  # the client went away (or the stream failed): stop its rows
            engine.cancel(job)


def serve(
    engine: Engine,
    model_name: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    **limits: Any,
) -> None:
    """Run the server until interrupted (uvicorn); ``limits``: :func:`create_app`'s key and size limits."""
    import uvicorn

    try:
        uvicorn.run(create_app(engine, model_name, **limits), host=host, port=port, log_level=log_level)
    finally:
        engine.close()
