"""POST /tokenize and POST /detokenize, in vLLM's request and response shapes: clients count a prompt's tokens
(and read the context they must fit) before they send it, and turn ids back into text.

The text is tokenized as /v1/completions and /generate tokenize a text prompt (special tokens' text is plain
text), and ids are checked against the vocabulary as a token-id prompt's are (serve/prompts.py).
"""
from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, Request

from data.tokenizer import decode, encode
from serve.errors import APIError
from serve.logprobs import TokenReader
from serve.prompts import check_vocabulary
from serve.schemas import (DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse,
                           error_responses)
from serve.state import ServerState, require_api_key, server_state

router = APIRouter(dependencies=[Depends(require_api_key)],
                   responses=error_responses(400, 401, 404, 408, 413, 422))


@router.post("/tokenize", response_model=TokenizeResponse, response_model_exclude_none=True)
async def tokenize(body: TokenizeRequest, request: Request):
    state = server_state(request)
    check_model(body.model, state)
    # On a worker thread: a body of megabytes (under a raised --max-body-bytes) takes seconds to tokenize, which on
    # the event loop would hold every other client, /health included, that long.
    ids, strings = await asyncio.to_thread(_tokens, body.prompt, body.return_token_strs)
    return TokenizeResponse(count=len(ids), max_model_len=state.block_size, tokens=ids, token_strs=strings)


def _tokens(prompt: str, with_strings: bool) -> tuple[list[int], list[str] | None]:
    ids = encode(prompt)
    if not with_strings:
        return ids, None
    reader = TokenReader(0)
    return ids, [reader.read(token)[0] for token in ids]


@router.post("/detokenize", response_model=DetokenizeResponse)
async def detokenize(body: DetokenizeRequest, request: Request):
    state = server_state(request)
    check_model(body.model, state)
    check_vocabulary(body.tokens, "tokens", state)
    return DetokenizeResponse(prompt=decode(body.tokens))


def check_model(model: str | None, state: ServerState) -> None:
    if model is not None and model != state.model_id:
        raise APIError(404, f"model {model!r} is not served here; this server serves {state.model_id!r} "
                            f"(see GET /v1/models), or leave model out", param="model", code="model_not_found")
