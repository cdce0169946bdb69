"""POST /generate: one prompt in, text and its latency out; server-sent events with `stream: true`.

The stream is a `token` event per generated token ({"token": id, "text": new text}; the text
of all token events joined is the final text), then one `done` event with the same body as
the non-streaming reply, or an `error` event.  With `logprobs`, each token event also carries
the token's log-probability and its alternatives, which the non-streaming reply lists in `logprobs`.
"""
from __future__ import annotations

import dataclasses
import json

from fastapi import APIRouter, Depends, Request

from decode.request_sampling import SAMPLING_FIELDS
from serve.events import DoneEvent, TokenEvent
from serve.errors import APIError, error_body
from serve.event_stream import EventStream
from serve.logprobs import TokenReader, token_logprobs, token_logprobs_fields
from serve.schemas import (GENERATE_EVENT, GenerateRequest, GenerateResponse, LatencyBody, SpeculativeBody,
                           error_responses, streamed_responses)
from serve.state import cache_salt, require_api_key, server_state
from serve.submission import Submission, error_for

router = APIRouter()


def sse(event: str, data: dict) -> str:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n"


def response_body(done: DoneEvent, with_logprobs: bool = True) -> GenerateResponse:
    """The reply; `with_logprobs=False` leaves out the log-probabilities (a stream's token events carried them)."""
    stats = done.speculative
    speculative = None if stats is None else SpeculativeBody(
        draft_tokens_proposed=stats.proposed, draft_tokens_accepted=stats.accepted,
        acceptance_rate=stats.acceptance_rate, tokens_per_target_pass=stats.tokens_per_target_pass)
    reader = TokenReader(0)
    logprobs = [token_logprobs(entry, reader) for entry in done.logprobs] \
        if with_logprobs and done.logprobs is not None else None
    return GenerateResponse(text=done.text, tokens=done.tokens, prompt_tokens=done.prompt_tokens,
                            finish_reason=done.finish_reason, latency=LatencyBody(**dataclasses.asdict(done.latency)),
                            speculative=speculative, logprobs=logprobs)


@router.post("/generate", response_model=GenerateResponse, dependencies=[Depends(require_api_key)],
             responses=streamed_responses("the reply; with stream: true, token events then a done or an error event",
                                          GENERATE_EVENT)
             | error_responses(400, 401, 408, 413, 422, 500, 503, 504))
async def generate(body: GenerateRequest, request: Request):
    state = server_state(request)
    prompt_ids = state.encode_within_context(body.prompt, body.max_new_tokens, "prompt", "max_new_tokens")
    state.check_top_k(body.top_k)
    params = state.sampling(body.model_dump(include=set(SAMPLING_FIELDS)))
    submission = Submission(state.engine, [(prompt_ids, params, body.stop_strings)], state.config.retry_after_s,
                            body.logprobs, streamed=body.stream, cache_salt=cache_salt(request, body.cache_salt))
    submission.submit()
    if not body.stream:
        [done] = await submission.results(request)
        return response_body(done)
    return EventStream(stream(submission), error_event, state.config.retry_after_s)


async def stream(submission: Submission):
    reader = TokenReader(0)  # labels each token's alternatives as its text so far leaves them
    try:
        async for batch in submission.event_batches():
            yield "".join(render(event, reader) for _, event in batch)
    finally:
        # Runs when the client disconnects too (Starlette cancels the stream): the row is freed.
        submission.cancel()


def render(event, reader: TokenReader) -> str:
    if isinstance(event, TokenEvent):
        data = {"token": event.token, "text": event.text}
        if event.logprob is not None:
            data |= token_logprobs_fields(event.logprob, reader)
        return sse("token", data)
    if isinstance(event, DoneEvent):
        tail = sse("token", {"token": None, "text": event.tail}) if event.tail else ""
        return tail + sse("done", response_body(event, with_logprobs=False).model_dump())
    return error_event(error_for(event))


def error_event(error: APIError) -> str:
    return sse("error", error_body(error.status, error.message, code=error.code))
