"""Request and response bodies: every field typed and bounded, unknown fields refused.

Checks that need the model (the prompt's length in tokens against the context, top-k against
the vocabulary) happen in the routes, after tokenizing.  The OpenAI schemas follow the order
and defaults of the OpenAI completions reference; the options this server cannot honour are
accepted only at their neutral value, so a client never silently gets something else.
"""
from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from decode.request_sampling import MAX_LOGIT_BIAS_ENTRIES
from decode.sampling import MAX_LOGIT_BIAS, MAX_PENALTY

MAX_SEED = 2**63 - 1
MAX_LOGPROBS = 5  # alternatives per position, as OpenAI's completions API allows
MAX_STOP_STRINGS = 4
StopString = Annotated[str, Field(min_length=1, max_length=100)]
# The count bounds the list alone: a bound on the field would also bound a single string's length.
StopStrings = StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)]
Probability = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
PromptText = Annotated[str, Field(min_length=1)]
TokenIds = Annotated[list[int], Field(min_length=1)]  # checked against the vocabulary in the route
# OpenAI's: {"token id": bias}, each bias in [-100, 100]; keys are checked against the vocabulary in the route.
LogitBias = Annotated[dict[str, Annotated[float, Field(ge=-MAX_LOGIT_BIAS, le=MAX_LOGIT_BIAS, allow_inf_nan=False)]],
                      Field(max_length=MAX_LOGIT_BIAS_ENTRIES, description=(
                          "added to each named token's logit before sampling (-100 bans a token, 100 all but forces "
                          "it); keys are token ids as decimal strings"))]
Penalty = Annotated[float, Field(ge=-MAX_PENALTY, le=MAX_PENALTY, allow_inf_nan=False)]
PRESENCE = ("subtracted from the logit of each token the completion has generated so far (OpenAI's "
            "presence_penalty; negative values encourage repeats)")
MAX_CACHE_SALT_CHARS = 1024
CACHE_SALT = ("prefix-cache isolation (as vLLM's field of that name): only requests with the same salt (and, on a "
              "server with API keys, the same key) reuse each other's cached prompt blocks; send a long random "
              "secret, e.g. 43 characters of base64, to keep your prompts' reuse to yourself")
CacheSalt = Annotated[str, Field(min_length=1, max_length=MAX_CACHE_SALT_CHARS, description=CACHE_SALT)]
FREQUENCY = ("subtracted from each token's logit once per time the completion has generated it so far (OpenAI's "
             "frequency_penalty)")


class StrictBody(BaseModel):
    # strict: "5" is not a number and true is not 1; JSON integers still fill float fields.
    model_config = ConfigDict(extra="forbid", strict=True)


# ---- POST /generate ----

class GenerateRequest(StrictBody):
    prompt: str = Field(min_length=1)
    max_new_tokens: int = Field(64, ge=1)
    temperature: float = Field(1.0, ge=0, le=10, allow_inf_nan=False, description="0 (or below 1e-4) means greedy")
    top_k: int | None = Field(None, ge=1)
    top_p: Probability | None = None
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stop: StopStrings = Field(default_factory=list)
    stream: bool = False
    ignore_eos: bool = Field(False, description="keep generating past end-of-text: exactly max_new_tokens tokens "
                                                 "(for benchmarks, as vLLM's option of that name)")
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS, description=(
        "each generated token's log-probability and this many most likely alternatives (the model's own "
        "distribution, as /v1/completions reports them): on each token event when streaming, else in the reply's "
        "logprobs"))
    logit_bias: LogitBias | None = None
    presence_penalty: Penalty = Field(0.0, description=PRESENCE)
    frequency_penalty: Penalty = Field(0.0, description=FREQUENCY)
    cache_salt: CacheSalt | None = None

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class TokenAlternative(BaseModel):
    token: int
    text: str  # the token's own text; one that ends inside a character shows as its bytes, "bytes:\\xNN"
    logprob: float  # under the model's distribution (temperature 1, no top-k/top-p)


class TokenLogprobs(TokenAlternative):
    """A generated token's log-probability and the most likely tokens at its position, best first."""
    top_logprobs: list[TokenAlternative]


class LatencyBody(BaseModel):
    queue_ms: float
    time_to_first_token_ms: float
    total_ms: float
    tokens_per_s: float


class SpeculativeBody(BaseModel):
    """A request's speculative decoding (a server started with --draft)."""
    draft_tokens_proposed: int
    draft_tokens_accepted: int  # of the proposed tokens, those the model kept and the reply holds
    acceptance_rate: float
    tokens_per_target_pass: float  # tokens the request gained per forward pass of the model (1: plain decoding)


class GenerateResponse(BaseModel):
    text: str
    tokens: int
    prompt_tokens: int
    finish_reason: str
    latency: LatencyBody
    speculative: SpeculativeBody | None = None
    # With `logprobs`: one entry per generated token, end-of-text included (none in a stream's done event: its
    # token events carried them).
    logprobs: list[TokenLogprobs] | None = None


# ---- POST /v1/completions (OpenAI) ----

class StreamOptions(StrictBody):
    include_usage: bool = False


class CompletionRequest(StrictBody):
    model: str
    prompt: PromptText | Annotated[list[PromptText], Field(min_length=1)] | TokenIds | \
        Annotated[list[TokenIds], Field(min_length=1)] = Field(
            description="a text, a list of texts, token ids (one tokenized prompt) or a list of token-id lists")
    best_of: int | None = Field(None, ge=1)
    cache_salt: CacheSalt | None = None
    echo: bool = False
    frequency_penalty: Penalty = Field(0.0, description=FREQUENCY)
    logit_bias: LogitBias | None = None
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS, description="log-probabilities of the chosen tokens "
                                                                            "and of this many alternatives per position")
    max_tokens: int = Field(16, ge=0, description="0 only with echo: score the prompt, generate nothing")
    n: int = Field(1, ge=1)
    presence_penalty: Penalty = Field(0.0, description=PRESENCE)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stop: StopStrings | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    suffix: str | None = None
    temperature: float = Field(1.0, ge=0, le=2, allow_inf_nan=False, description="0 (or below 1e-4) means greedy")
    top_p: Probability = 1.0
    user: str | None = None
    ignore_eos: bool = Field(False, description="not OpenAI's: keep generating past end-of-text, exactly max_tokens "
                                                 "tokens (for benchmarks; vLLM and llama.cpp's server take it too)")

    @field_validator("prompt", mode="wrap")
    @classmethod
    def _prompt_form(cls, value, handler):
        # A value of no accepted form fails every alternative of the union: say what the forms are, rather
        # than why it is not the first one.  A value of the right form but breaking a bound keeps its error.
        try:
            return handler(value)
        except ValidationError as e:
            if all(error["type"].endswith("_type") for error in e.errors()):
                raise ValueError("must be a text, a list of texts, a list of token ids (integers) or a list of "
                                 "such lists") from None
            raise

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v):
        if v:
            raise ValueError("suffix (insertion) is not supported by this server; leave it out")
        return v

    @model_validator(mode="after")
    def _scoring(self):
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens: 0 generates nothing; it is allowed only with echo (to score the prompt)")
        return self

    @model_validator(mode="after")
    def _best_of_is_n(self):
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError(f"best_of={self.best_of} differs from n={self.n}; this server returns every "
                             f"completion it generates, so leave best_of out")
        return self

    @property
    def prompts(self) -> list[str | list[int]]:
        """Each prompt, as text or as token ids."""
        return [self.prompt] if self.single_prompt else list(self.prompt)

    @property
    def single_prompt(self) -> bool:
        return isinstance(self.prompt, str) or isinstance(self.prompt[0], int)

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionLogprobs(BaseModel):
    """OpenAI's completions format: one entry per token of the returned text (the prompt's first, with echo)."""
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    text: str
    index: int
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None


class CompletionTokensDetails(BaseModel):
    """OpenAI's fields for tokens predicted ahead (its Predicted Outputs): here the draft model's tokens that the
    model kept, and those it rejected, with --draft."""
    accepted_prediction_tokens: int
    rejected_prediction_tokens: int


class CompletionUsage(BaseModel):
    completion_tokens: int
    prompt_tokens: int
    total_tokens: int
    completion_tokens_details: CompletionTokensDetails | None = None


class Completion(BaseModel):
    id: str
    choices: list[CompletionChoice]
    created: int
    model: str
    object: str = "text_completion"
    usage: CompletionUsage | None = None


class ModelCard(BaseModel):
    id: str
    created: int
    object: str = "model"
    owned_by: str


class ModelList(BaseModel):
    object: str = "list"
    data: list[ModelCard]


# ---- POST /tokenize and /detokenize (vLLM's shapes) ----

# The most ids one /detokenize takes: many contexts' worth, so that no client text is refused, and bounded, so that
# a body of ids alone (--max-body-bytes raised) cannot hold the server on one request.
MAX_DETOKENIZE_TOKENS = 16384


class TokenizeRequest(StrictBody):
    model: str | None = Field(None, description="the served model's id (as /v1/models lists it); may be left out")
    prompt: str = Field(description="the text to tokenize, as /v1/completions tokenizes a text prompt")
    add_special_tokens: bool = Field(True, description="vLLM's option; GPT-2's tokenizer adds no special tokens "
                                                       "(no beginning-of-text), so either value gives the same ids")
    return_token_strs: bool = Field(False, description="also each token's text (one that ends inside a character "
                                                       "as its bytes, bytes:\\xNN, as logprobs label it)")


class TokenizeResponse(BaseModel):
    count: int  # tokens in the prompt
    max_model_len: int  # the model's context: a prompt and its new tokens must fit in it
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(StrictBody):
    model: str | None = Field(None, description="the served model's id (as /v1/models lists it); may be left out")
    tokens: Annotated[list[int], Field(max_length=MAX_DETOKENIZE_TOKENS)] = Field(
        description="token ids, each within the vocabulary")


class DetokenizeResponse(BaseModel):
    prompt: str


# ---- errors (serve/errors.py) and the responses each route documents ----

class ErrorDetail(BaseModel):
    message: str  # names the field at fault and the fix
    type: str
    param: str | None  # the field at fault, with list positions: "stop[0]"
    code: str | None


class ErrorResponse(BaseModel):
    """Every error's body, OpenAI's shape: the official client reads `error.message` from it."""
    error: ErrorDetail


ERROR_DESCRIPTIONS = {
    400: "the body is not valid JSON", 401: "missing or wrong API key (when the server requires one)",
    404: "the model is not served here", 408: "the body did not arrive within --read-timeout-s",
    413: "the body is larger than --max-body-bytes", 422: "a field is invalid; the message names it and the fix",
    500: "generation failed; the server log has the details",
    503: "the server is busy or shutting down; retry after the Retry-After header's seconds",
    504: "the request ran past --request-timeout-s"}


def error_responses(*statuses: int) -> dict[int | str, dict]:
    """OpenAPI `responses` for these error statuses, each with the one error body."""
    return {status: {"model": ErrorResponse, "description": ERROR_DESCRIPTIONS[status]} for status in statuses}


def streamed_responses(description: str, event: dict) -> dict[int | str, dict]:
    """The 200 of a route that streams with `stream: true`: its JSON reply (the route's response_model), or
    server-sent events, each as `event` describes it (before OpenAPI 3.2 a stream's schema describes one event)."""
    return {200: {"description": description, "content": {"text/event-stream": {"schema": event}}}}


def component(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def json_text(schema: dict) -> dict:
    """An event's data field: JSON text holding a value of `schema`."""
    return {"type": "string", "contentMediaType": "application/json", "contentSchema": schema}


# With `logprobs`, a generated token's event also holds its log-probability and alternatives (TokenLogprobs'); the
# last event before `done` may carry text held back for a stop string, with token null.
TOKEN_EVENT_DATA = {"type": "object", "required": ["token", "text"], "additionalProperties": False,
                    "properties": {"token": {"type": ["integer", "null"]}, "text": {"type": "string"},
                                   "logprob": {"type": "number"},
                                   "top_logprobs": {"type": "array", "items": component("TokenAlternative")}}}
# /generate's events: `token`, then `done` with the reply, or `error`.
GENERATE_EVENT = {"type": "object", "required": ["event", "data"], "oneOf": [
    {"properties": {"event": {"const": "token"}, "data": json_text(TOKEN_EVENT_DATA)}},
    {"properties": {"event": {"const": "done"}, "data": json_text(component("GenerateResponse"))}},
    {"properties": {"event": {"const": "error"}, "data": json_text(component("ErrorResponse"))}}]}
# OpenAI's: unnamed events holding completion chunks, then [DONE] (not JSON), or an error and no [DONE].
COMPLETION_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {
    "if": {"const": "[DONE]"},
    "else": json_text({"anyOf": [component("Completion"), component("ErrorResponse")]})}}}
