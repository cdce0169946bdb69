"""The OpenAI completions API (POST /v1/completions, GET /v1/models), so existing clients work unchanged.

Each prompt times `n` is one engine request; choice `index` runs prompt-major, as OpenAI's does.
With a `seed`, completion i samples with seed + i, so the `n` completions differ from each
other yet repeat exactly from call to call.
"""
from __future__ import annotations

import json
import time
import uuid

from fastapi import APIRouter, Depends, Request

from decode.request_sampling import SAMPLING_FIELDS
from decode.row_state import OPENAI_FINISH_REASONS
from serve.completion_chunks import CompletionChunks
from serve.events import DoneEvent, ErrorEvent, TokenEvent
from serve.errors import APIError, error_body
from serve.event_stream import EventStream
from serve.logprobs import StreamedLogprobs, completion_logprobs, prompt_logprobs
from serve.prompts import Prompt, completion_prompts
from serve.schemas import (COMPLETION_EVENT, Completion, CompletionChoice, CompletionRequest,
                           CompletionTokensDetails, CompletionUsage, ModelCard, ModelList, error_responses,
                           streamed_responses)
from serve.state import ServerState, cache_salt, require_api_key, server_state
from serve.submission import Submission, error_for

router = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)], responses=error_responses(401))


@router.get("/models", response_model=ModelList)
async def list_models(request: Request):
    state = server_state(request)
    return ModelList(data=[ModelCard(id=state.model_id, created=state.created, owned_by="gpt2-monorepo")])


@router.post("/completions", response_model=Completion,
             responses=streamed_responses("the completions; with stream: true, OpenAI's chunks, then data: [DONE] "
                                          "or an error", COMPLETION_EVENT)
             | error_responses(400, 404, 408, 413, 422, 500, 503, 504))
async def create_completion(body: CompletionRequest, request: Request):
    state = server_state(request)
    if body.model != state.model_id:
        raise APIError(404, f"model {body.model!r} is not served here; this server serves {state.model_id!r} "
                            f"(see GET /v1/models)", param="model", code="model_not_found")
    check_count(body, state)
    prompts = completion_prompts(body, state)
    jobs = completion_jobs(body, prompts, state)
    submission = Submission(state.engine, jobs, state.config.retry_after_s, body.logprobs, body.echo, body.stream,
                            cache_salt(request, body.cache_salt))
    submission.submit()
    completion_id, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    prompt_texts = [prompt.text for prompt in prompts for _ in range(body.n)]  # choice order
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        chunks = stream(submission, completion_id, created, state.model_id, include_usage, body.n, prompt_texts,
                        body.echo, body.logprobs is not None)
        return EventStream(chunks, error_event, state.config.retry_after_s)
    results = await submission.results(request)
    choices = [completion_choice(r, i, prompt_texts[i], body.echo) for i, r in enumerate(results)]
    return Completion(id=completion_id, choices=choices, created=created, model=state.model_id, usage=usage(results, body.n))


def completion_choice(result: DoneEvent, index: int, prompt_text: str, echo: bool) -> CompletionChoice:
    """The choice's text (after the prompt, with echo) and, when asked for, its log-probabilities."""
    logprobs = None if result.logprobs is None else completion_logprobs(result, prompt_text, echo)
    return CompletionChoice(text=(prompt_text if echo else "") + result.text, index=index, logprobs=logprobs,
                            finish_reason=OPENAI_FINISH_REASONS[result.finish_reason])


def check_count(body: CompletionRequest, state: ServerState) -> None:
    count = len(body.prompts) * body.n
    asked = f"n: {len(body.prompts)} prompt(s) x n={body.n} asks for {count} completions"
    if count > state.config.max_completions:
        raise APIError(422, f"{asked}; this server allows at most {state.config.max_completions} per request",
                       param="n")
    # A request is queued whole or refused (Submission.submit): one larger than the batch and the queue
    # together would get a 503 "busy, retry" forever, even on an idle server.
    capacity = state.config.max_batch_size + state.config.max_queue
    if count > capacity:
        raise APIError(422, f"{asked}; this server holds at most {capacity} at once (--max-batch-size "
                            f"{state.config.max_batch_size} + --max-queue {state.config.max_queue}), so it could "
                            f"never accept them: ask for fewer", param="n")


def completion_jobs(body: CompletionRequest, prompts: list[Prompt], state: ServerState) -> list:
    fields = body.model_dump(include=set(SAMPLING_FIELDS)) | {"max_new_tokens": body.max_tokens}
    jobs = []
    for p, prompt in enumerate(prompts):
        for j in range(body.n):
            index = p * body.n + j
            seed = None if body.seed is None else (body.seed + index) % 2**63
            jobs.append((prompt.ids, state.sampling(fields | {"seed": seed}), body.stop_strings))
    return jobs


def usage(results: list[DoneEvent], n: int) -> CompletionUsage:
    """Results in choice order; each prompt counts once however many completions it got."""
    completion = sum(r.tokens for r in results)
    prompt = sum(r.prompt_tokens for r in results[::n])
    drafted = [r.speculative for r in results if r.speculative is not None]
    details = CompletionTokensDetails(
        accepted_prediction_tokens=sum(s.accepted for s in drafted),
        rejected_prediction_tokens=sum(s.proposed - s.accepted for s in drafted)) if drafted else None
    return CompletionUsage(completion_tokens=completion, prompt_tokens=prompt, total_tokens=completion + prompt,
                           completion_tokens_details=details)


async def stream(submission: Submission, completion_id: str, created: int, model_id: str, include_usage: bool,
                 n: int, prompt_texts: list[str], echo: bool, logprobs: bool):
    """Server-sent chunks: each choice's echoed prompt first (as OpenAI streams it), then its text as it comes.
    With `logprobs`, each chunk carries the entries of the tokens its text completes (serve/logprobs.py's
    StreamedLogprobs), and an echoed prompt waits for its own entries, which the row's prefill computes."""
    chunks = CompletionChunks(completion_id, created, model_id)
    echoes = [text if echo else "" for text in prompt_texts]
    results: dict[int, DoneEvent] = {}
    scored = [StreamedLogprobs(text) for text in prompt_texts] if logprobs else None
    echo_waits = set(range(len(echoes))) if echo and logprobs else set()
    try:
        if echo and not logprobs:
            yield "".join(chunks.choice(text, i) for i, text in enumerate(echoes))
        async for batch in submission.event_batches():
            out = []
            for index, event in batch:
                if index in echo_waits and not isinstance(event, ErrorEvent):
                    echo_waits.discard(index)
                    entries = event.prompt_logprobs if isinstance(event, TokenEvent) else \
                        event.logprobs[:event.prompt_tokens]
                    out.append(chunks.choice(echoes[index], index, logprobs=prompt_logprobs(entries)))
                if isinstance(event, TokenEvent):
                    entries = scored[index].token(event.logprob, event.text) if scored is not None else None
                    if event.text or (entries is not None and entries.tokens):
                        out.append(chunks.choice(event.text, index, logprobs=entries))
                elif isinstance(event, DoneEvent):
                    results[index] = event
                    entries = scored[index].done(event, echo) if scored is not None else None
                    out.append(chunks.choice(event.tail, index, OPENAI_FINISH_REASONS[event.finish_reason], entries))
                elif isinstance(event, ErrorEvent):
                    yield "".join(out) + error_event(error_for(event))
                    return
            if out:
                yield "".join(out)
        if include_usage:
            last = Completion(id=completion_id, choices=[], created=created, model=model_id,
                              usage=usage([results[i] for i in sorted(results)], n))
            yield f"data: {json.dumps(last.model_dump(exclude_none=True))}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        submission.cancel()


def error_event(error: APIError) -> str:
    """An error in a stream, as OpenAI sends one: a data line holding the error body, and no [DONE] after it."""
    return f"data: {json.dumps(error_body(error.status, error.message, code=error.code))}\n\n"
