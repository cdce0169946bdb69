"""Steps launched ahead (serve/runner.py's `async_steps`): on the CPU, which runs the same code as a GPU, every
request gets the same events as with each step's tokens read back before the next step launches: tokens, texts,
log-probabilities, ends.  A row that ends leaves one step late, and the token sampled for it then is never
delivered."""
from __future__ import annotations

import time

import pytest
import torch

from decode.row_state import TokenLogprob
from decode.sampling import SamplingParams
from model.gpt import GPT
from serve.config import ServeConfig, ServeConfigError
from serve.engine import Engine
from serve.events import DoneEvent, ErrorEvent, GenerationRequest, TokenEvent
from serve.runner import launches_ahead
from tests.conftest import small_config

BLOCK_SIZE = 32


@pytest.fixture(scope="module")
def model() -> GPT:
    torch.manual_seed(0)
    return GPT(small_config(block_size=BLOCK_SIZE, vocab_size=2048)).eval()


class Recorder:
    """Each request's events, in order, as comparable tuples (a reply's latency left out); and the order of
    passes and deliveries, when the engine's steps are watched (`watch`)."""

    def __init__(self, count: int):
        self.events: list[list[tuple]] = [[] for _ in range(count)]
        self.order: list[str] = []
        self.ended = 0

    def callback(self, i: int, on_token=None):
        def on_event(event):
            if isinstance(event, TokenEvent):
                self.order.append("token")
                self.events[i].append(("token", event.token, event.text, event.logprob, event.prompt_logprobs))
                if on_token is not None:
                    on_token()
                return
            self.order.append("end")
            if isinstance(event, DoneEvent):
                self.events[i].append(("done", event.text, event.tail, event.tokens, event.finish_reason,
                                       event.logprobs))
            else:
                assert isinstance(event, ErrorEvent)
                self.events[i].append(("error", event.kind, event.message))
            self.ended += 1
        return on_event

    def watch(self, engine: Engine) -> None:
        """Log each pass of the served model: a prompt's, or a step's."""
        steps = engine.runner.steps
        logits = steps.logits

        def watched(cache, inputs, positions, tokens_left=None):
            self.order.append("step" if cache.length > 0 else "prompt")
            return logits(cache, inputs, positions, tokens_left)

        steps.logits = watched


def serve(model: GPT, jobs: list[dict], async_steps: str, decode: str = "dynamic", max_batch_size: int = 3,
          prefix_cache_bytes: int = 0, cancel_after: dict[int, int] | None = None, watch: bool = False,
          device: str = "cpu") -> tuple[Recorder, Engine]:
    """Run `jobs` (GenerationRequest's fields beside its callback) through one engine, submitted together; with
    `cancel_after`, request i cancels itself on receiving its n-th token.  Returns once the engine has stopped."""
    engine = Engine(model, torch.device(device), max_batch_size=max_batch_size, max_queue=64, request_timeout_s=120,
                    decode=decode, prefix_cache_bytes=prefix_cache_bytes, async_steps=async_steps)
    assert engine.runner.launch_ahead == (async_steps == "on")
    recorder = Recorder(len(jobs))
    if watch:
        recorder.watch(engine)
    engine.start()
    try:
        for i, job in enumerate(jobs):
            request = GenerationRequest(on_event=lambda event: None, **job)
            on_token = None
            if cancel_after and i in cancel_after:
                def on_token(request=request, i=i, n=cancel_after[i]):
                    if len(recorder.events[i]) == n:
                        request.cancel()
            request.on_event = recorder.callback(i, on_token)
            engine.submit(request)
        ending = len(jobs) - len(cancel_after or {})  # a cancelled request hears nothing more: it never ends
        deadline = time.monotonic() + 60
        while recorder.ended < ending:
            assert time.monotonic() < deadline, f"only {recorder.ended} of {ending} requests ended"
            time.sleep(0.01)
    finally:
        engine.stop()
    return recorder, engine


def both(model: GPT, jobs: list[dict], **settings) -> tuple[Recorder, Recorder]:
    """The same jobs with steps read back before the next launches (`off`) and launched ahead (`on`)."""
    return serve(model, jobs, "off", **settings)[0], serve(model, jobs, "on", **settings)[0]


def same(a, b) -> bool:
    """Equal events: tokens, texts and ends exactly, log-probabilities to 1e-5.  Launched ahead, a row that ends
    leaves the batch one step late, so the rows beside it pass once in a batch a row larger, and a CPU's matrix
    products need not round alike at two batch sizes (on an AMD EPYC host one alternative's log-probability
    differed in its last bits)."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-5
    if isinstance(a, TokenLogprob) and isinstance(b, TokenLogprob):
        return same((a.token, a.logprob, a.top), (b.token, b.logprob, b.top))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def counted(engine: Engine) -> float:
    """The tokens the engine's metrics count as generated."""
    return engine.metrics.tokens.values[()]


def prompt(length: int, start: int) -> list[int]:
    return [(start + 37 * i) % 2048 for i in range(length)]


def mixed_jobs() -> list[dict]:
    """More requests than rows (they join and leave as others end), greedy and seeded sampling, penalties and a
    logit bias, end-of-text kept or not, and one that fills the context exactly."""
    settings = [dict(temperature=0), dict(temperature=0.9, seed=3), dict(temperature=0.8, top_k=40, seed=4),
                dict(temperature=1.1, top_p=0.9, seed=5), dict(temperature=0, presence_penalty=1.5,
                                                              frequency_penalty=0.7),
                dict(temperature=0.7, seed=6, frequency_penalty=-1.2, logit_bias=((7, 5.0), (1999, -100.0))),
                dict(temperature=0, logit_bias=((11, 3.0),)), dict(temperature=1.3, top_k=5, seed=7,
                                                                   presence_penalty=2.0)]
    jobs = []
    for i, extra in enumerate(settings):
        length = 2 + 3 * i % 11
        new = BLOCK_SIZE - length if i == 2 else 4 + 2 * i
        jobs.append(dict(prompt_ids=prompt(length, 5 + 101 * i),
                         params=SamplingParams(max_new_tokens=new, stop_at_eot=i % 2 == 0, **extra)))
    return jobs


@pytest.mark.parametrize("decode", ["dynamic", "traced"])
def test_requests_joining_and_leaving_get_the_same_events_with_steps_launched_ahead(model, decode):
    """Greedy and seeded sampling with penalties and biases, rows joining and leaving a batch of three: every
    token, text and reply is the one the steps read back one at a time give, and the tokens counted are the
    delivered ones (the extra ones sampled a step late count nowhere)."""
    jobs = mixed_jobs()
    (off, off_engine), (on, on_engine) = (serve(model, jobs, mode, decode=decode) for mode in ("off", "on"))
    assert same(on.events, off.events)
    assert all(events[-1][0] == "done" for events in on.events)
    assert any(events[-1][4] == "length" and events[-1][3] == BLOCK_SIZE - len(job["prompt_ids"])
               for events, job in zip(on.events, jobs))  # the row that fills the context ran past its end
    delivered = sum(sum(event[0] == "token" for event in events) for events in on.events)
    assert counted(on_engine) == counted(off_engine)
    assert delivered <= counted(on_engine)  # end-of-text is counted, but not sent as a token


def test_each_step_launches_before_the_tokens_of_the_one_before_are_delivered(model):
    """One greedy request of five tokens: read back step by step, each step's token goes out before the next
    pass; launched ahead, each goes out after the next pass has launched, and the row runs one pass past its
    last token, whose token nobody receives."""
    job = dict(prompt_ids=prompt(4, 9), params=SamplingParams(max_new_tokens=5, temperature=0, stop_at_eot=False))
    off, _ = serve(model, [job], "off", watch=True)
    on, _ = serve(model, [job], "on", watch=True)
    assert off.order == ["prompt", "token", *["step", "token"] * 4, "end"]
    assert on.order == ["prompt", "token", "step", *["step", "token"] * 4, "end"]
    assert same(on.events, off.events) and sum(event[0] == "token" for event in on.events[0]) == 5


def test_a_stop_string_ends_the_row_at_the_same_token_and_its_extra_token_is_never_delivered(model):
    """A stop string found in a greedy reply's middle: launched ahead, the row still ends at the token that
    completes it, with the same text, and the token sampled for it in the step launched before that was known
    reaches nobody; its neighbours go on as before."""
    plain = dict(prompt_ids=prompt(3, 17), params=SamplingParams(max_new_tokens=12, temperature=0,
                                                                  stop_at_eot=False))
    text = serve(model, [plain], "off")[0].events[0][-1][1]
    stop = text[len(text) // 2: len(text) // 2 + 2]
    assert stop.strip(), f"the reply {text!r} gives no stop string"
    neighbour = dict(prompt_ids=prompt(5, 3), params=SamplingParams(max_new_tokens=16, temperature=0.9, seed=2,
                                                                    stop_at_eot=False))
    off, on = both(model, [dict(plain, stop=[stop]), neighbour])
    assert same(on.events, off.events)
    done = on.events[0][-1]
    assert done[4] == "stop" and stop not in done[1] and done[3] < 12
    assert sum(event[0] == "token" for event in on.events[0]) == done[3]  # no token after the one that stopped it


def test_a_request_cancelled_mid_stream_hears_nothing_more_and_its_neighbours_go_on(model):
    """A client that goes away after its third token: no token or reply reaches it after that, whichever step
    was launched meanwhile, and the other rows keep the tokens they get without it."""
    jobs = [dict(prompt_ids=prompt(3 + i, 40 * i), params=SamplingParams(max_new_tokens=10, temperature=0.8,
                                                                         seed=i, stop_at_eot=False))
            for i in range(3)]
    off, on = both(model, jobs, cancel_after={1: 3})
    assert same(on.events, off.events)
    assert [event[0] for event in on.events[1]] == ["token"] * 3
    assert all(events[-1][0] == "done" for i, events in enumerate(on.events) if i != 1)


def test_log_probabilities_are_the_same_launched_ahead(model):
    """Each token's log-probability and its best alternatives (none, or three), the prompt's with echo, are the
    same numbers as read back step by step, worked out before the next step overwrites the logits."""
    jobs = [dict(prompt_ids=prompt(4, 1), params=SamplingParams(max_new_tokens=8, temperature=0), logprobs=3),
            dict(prompt_ids=prompt(6, 2), params=SamplingParams(max_new_tokens=7, temperature=0.9, seed=1),
                 logprobs=0, echo=True),
            dict(prompt_ids=prompt(2, 3), params=SamplingParams(max_new_tokens=9, temperature=0))]
    off, on = both(model, jobs)
    assert same(on.events, off.events)
    done = on.events[0][-1]
    assert len(done[5]) == done[3] and all(len(entry.top) == 3 for entry in done[5])
    assert all(event[3] is not None for event in on.events[1] if event[0] == "token")


def test_prefix_cache_hits_give_the_same_tokens_launched_ahead(model):
    """Prompts that share a prefix of whole blocks, through the prefix cache: the same events, with its reuse."""
    shared = prompt(16, 77)
    jobs = [dict(prompt_ids=shared + prompt(n, n), params=SamplingParams(max_new_tokens=6, temperature=0.7,
                                                                          seed=n, stop_at_eot=False))
            for n in (1, 3, 5, 7)]
    off, _ = serve(model, jobs, "off", prefix_cache_bytes=8 << 20)
    on, engine = serve(model, jobs, "on", prefix_cache_bytes=8 << 20)
    assert same(on.events, off.events)
    assert engine.metrics.prefix_hits.values[()] > 0


def test_steps_launch_ahead_by_default_on_a_gpu_alone_and_never_with_a_draft():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert launches_ahead("auto", cuda, speculative=False)
    assert not launches_ahead("auto", cpu, speculative=False)
    assert not launches_ahead("auto", cuda, speculative=True)
    assert launches_ahead("on", cpu, speculative=False) and not launches_ahead("off", cuda, speculative=False)
    with pytest.raises(ValueError, match="speculative"):
        launches_ahead("on", cuda, speculative=True)
    with pytest.raises(ValueError, match="not one of"):
        launches_ahead("sometimes", cpu, speculative=False)


def test_the_server_refuses_steps_launched_ahead_with_a_draft_in_one_line():
    with pytest.raises(ServeConfigError, match="--async-steps at auto or off with --draft"):
        ServeConfig(async_steps="on", draft="some/draft")
    assert ServeConfig(async_steps="off", draft="some/draft").async_steps == "off"
