"""The serving engine without HTTP: continuous batching equals generating alone, rows join, leave and shift."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from decode.generate import generate
from model.gpt import GPT
from runtime import huge_pages
from decode.sampling import SamplingParams, sample_rows, sample_rows_on_device
from decode.steps import DECODE_MODES
from decode.text import TextAssembler
from serve.engine import Engine
from serve.events import DoneEvent, ErrorEvent, GenerationRequest, TokenEvent
from serve.scheduler import QueueFull
from serve.metrics import ServerMetrics
from serve.slots import Slots
from tests.conftest import small_config


class Collector:
    """Events of several requests, by request index; `wait` returns once every request ended."""

    def __init__(self, count: int):
        self.tokens = [[] for _ in range(count)]
        self.ends: dict[int, DoneEvent | ErrorEvent] = {}
        self.count = count
        self.all_ended = threading.Event()

    def callback(self, i: int):
        def on_event(event):
            if isinstance(event, TokenEvent):
                self.tokens[i].append(event.token)
            else:
                self.ends[i] = event
                if len(self.ends) == self.count:
                    self.all_ended.set()
        return on_event

    def wait(self, timeout_s: float = 60):
        assert self.all_ended.wait(timeout_s), f"only {len(self.ends)} of {self.count} requests ended"
        return self


def run(engine: Engine, jobs: list[tuple[list[int], SamplingParams]]) -> Collector:
    collector = Collector(len(jobs))
    for i, (ids, params) in enumerate(jobs):
        engine.submit(GenerationRequest(ids, params, collector.callback(i)))
    return collector.wait()


@pytest.fixture(scope="module")
def short_context_model() -> GPT:
    # A context of 16 makes the slot cache (32 columns) shift rows both ways in a short test.
    torch.manual_seed(0)
    return GPT(small_config(block_size=16, vocab_size=2048)).eval()


def test_auto_decodes_through_the_traced_steps_on_the_cpu(short_context_model):
    assert DECODE_MODES[0] == "auto"  # the server's default
    engine = Engine(short_context_model, torch.device("cpu"), max_batch_size=2, max_queue=2, request_timeout_s=60)
    assert engine.decode == "traced" and engine.runner.steps.traced is not None


@pytest.fixture(params=[mode for mode in DECODE_MODES if mode not in ("auto", "cuda-graph")])  # cuda-graph: test_cuda.py
def engine(short_context_model, request):
    # Six rows: a traced step's five active rows run padded to six.
    engine = Engine(short_context_model, torch.device("cpu"), max_batch_size=6, max_queue=32, request_timeout_s=60,
                    decode=request.param)
    engine.start()
    yield engine
    engine.stop()


def mixed_jobs(count: int, block_size: int) -> list[tuple[list[int], SamplingParams]]:
    """Prompts of different lengths, greedy and seeded sampling with different settings."""
    g = torch.Generator().manual_seed(1)
    jobs = []
    for i in range(count):
        prompt_len = int(torch.randint(1, block_size // 2, (1,), generator=g))
        max_new = int(torch.randint(2, block_size - prompt_len + 1, (1,), generator=g))
        settings = [dict(temperature=0.0), dict(temperature=0.9, seed=i), dict(temperature=1.2, top_k=40, seed=i),
                    dict(temperature=0.7, top_p=0.8, seed=1000 + i)][i % 4]
        ids = torch.randint(0, 2048, (prompt_len,), generator=g).tolist()
        # End-of-text would end rows at random points; lengths are the point here.
        jobs.append((ids, SamplingParams(max_new_tokens=max_new, stop_at_eot=False, **settings)))
    return jobs


def test_batched_generation_equals_generating_alone(engine, short_context_model, monkeypatch):
    steps = []  # (padded with free rows, the active rows' lengths differ)
    original_views = Slots.views
    monkeypatch.setattr(Slots, "views", lambda self, rows=None: (
        steps.append((rows is not None and rows > self.rows, len(set(self.lengths[:self.rows].tolist())) > 1)),
        original_views(self, rows))[1])
    jobs = mixed_jobs(24, short_context_model.config.block_size)
    alone = [run(engine, [job]).tokens[0] for job in jobs]
    steps.clear()
    together = run(engine, jobs)
    assert together.tokens == alone
    assert [together.ends[i].tokens for i in range(len(jobs))] == [p.max_new_tokens for _, p in jobs]
    # The batch really was continuous: rows at different lengths decoded together while sequences joined and left.
    assert any(ragged for _, ragged in steps)
    if engine.decode == "traced":  # and traced steps ran on padded batches too
        assert any(padded for padded, _ in steps) and not all(padded for padded, _ in steps)
    # Every row also equals decode.generate, which sample.py uses: same sampler, same seeds.
    for (ids, params), tokens in zip(jobs, alone):
        reference = generate(short_context_model, torch.tensor([ids]), params)
        assert reference[0, len(ids):].tolist() == tokens


@pytest.mark.parametrize("kind", ["pruned", "int8"])
def test_traced_steps_serve_pruned_and_int8_models_as_generate_does(kind):
    """Layers of different widths (a pruned artifact) and int8 layers with the int8 head trace too, and a request
    gets generate()'s tokens. (Alone: int8 activations are quantized over the whole batch.)"""
    from model.int8 import quantize_model
    from model.packed_linear import pack_for_inference
    torch.manual_seed(0)
    widths = dict(n_head_per_layer=[3, 1], mlp_hidden=[40, 24]) if kind == "pruned" else {}
    model = GPT(small_config(block_size=16, vocab_size=2048, **widths)).eval()
    if kind == "int8":
        quantize_model(model, head="int8")
    pack_for_inference(model)
    engine = Engine(model, torch.device("cpu"), max_batch_size=2, max_queue=4, request_timeout_s=60)
    engine.warm_up()
    engine.start()
    try:
        for ids, params in mixed_jobs(4, 16):
            tokens = run(engine, [(ids, params)]).tokens[0]
            assert generate(model, torch.tensor([ids]), params)[0, len(ids):].tolist() == tokens
    finally:
        engine.stop()


def test_same_seed_repeats_and_different_seeds_differ(engine):
    params = lambda seed: SamplingParams(max_new_tokens=10, temperature=1.0, seed=seed, stop_at_eot=False)
    out = run(engine, [([1, 2, 3], params(5)), ([1, 2, 3], params(5)), ([1, 2, 3], params(6))]).tokens
    assert out[0] == out[1] != out[2]


def test_queue_full_is_refused(short_context_model):
    engine = Engine(short_context_model, torch.device("cpu"), max_batch_size=2, max_queue=1, request_timeout_s=60)
    request = lambda: GenerationRequest([1], SamplingParams(max_new_tokens=3), lambda event: None)
    for _ in range(3):  # two free rows and one queue place; the engine thread is not running
        engine.submit(request())
    with pytest.raises(QueueFull, match="limit 1 beyond a full batch of 2"):
        engine.submit(request())


class SlowModel(torch.nn.Module):
    """The model, a fixed time slower per forward pass after its first `fast_calls`: makes time limits testable
    (with eager decode steps, which are forward passes)."""

    def __init__(self, model: GPT, delay_s: float, fast_calls: int = 0):
        super().__init__()
        self.model, self.config, self.delay_s, self.fast_calls = model, model.config, delay_s, fast_calls

    def forward(self, *args, **kwargs):
        if self.fast_calls:
            self.fast_calls -= 1
        else:
            time.sleep(self.delay_s)
        return self.model(*args, **kwargs)


def test_time_limit_ends_a_request_with_a_clear_error(short_context_model):
    """Some tokens, then the limit: the first three passes run at the model's speed, and each after them takes
    longer than the whole limit, so the limit falls mid-request however busy the host is."""
    engine = Engine(SlowModel(short_context_model, 1.5, fast_calls=3), torch.device("cpu"), max_batch_size=2,
                    max_queue=4, request_timeout_s=1.0, decode="dynamic")
    engine.start()
    try:
        # As many tokens as the context of 16 holds: the engine refuses more at submission.
        out = run(engine, [([1, 2], SamplingParams(max_new_tokens=14, stop_at_eot=False))])
    finally:
        engine.stop()
    error = out.ends[0]
    assert isinstance(error, ErrorEvent) and error.kind == "timeout"
    assert "time limit of 1s" in error.message and "of 14 tokens" in error.message
    assert 0 < len(out.tokens[0]) < 14
    assert engine.batch_size == 0 and engine.runner.slots.rows == 0


def test_a_stopped_engine_serves_again_once_started(short_context_model):
    """An app's lifespan can run twice (a test client entered again); the engine starts and stops with it."""
    engine = Engine(short_context_model, torch.device("cpu"), max_batch_size=2, max_queue=2, request_timeout_s=60,
                    decode="dynamic")
    job = ([1, 2], SamplingParams(max_new_tokens=3, temperature=0.0, stop_at_eot=False))
    runs = []
    for _ in range(2):
        engine.start()
        try:
            runs.append(run(engine, [job]).tokens[0])
        finally:
            engine.stop()
    assert runs[0] == runs[1] and len(runs[0]) == 3


def test_cancelled_request_leaves_the_batch(short_context_model):
    engine = Engine(SlowModel(short_context_model, 0.01), torch.device("cpu"), max_batch_size=2, max_queue=4,
                    request_timeout_s=60, decode="dynamic")
    first_token = threading.Event()
    events = []

    def on_event(event):
        events.append(event)
        first_token.set()

    request = GenerationRequest([1, 2], SamplingParams(max_new_tokens=14, stop_at_eot=False), on_event)
    engine.start()
    try:
        engine.submit(request)
        assert first_token.wait(30)
        request.cancel()
        deadline = time.monotonic() + 120  # a hang guard: the events below show the row left early
        while engine.batch_size and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.batch_size == 0 and engine.runner.slots.rows == 0
        # The freed row serves the next request.
        assert isinstance(run(engine, [([3], SamplingParams(max_new_tokens=2))]).ends[0], DoneEvent)
    finally:
        engine.stop()
    assert len(events) < 14 and not any(isinstance(e, DoneEvent) for e in events)


def test_engine_reports_metrics(engine):
    metrics: ServerMetrics = engine.metrics
    run(engine, [([1, 2], SamplingParams(max_new_tokens=4, stop_at_eot=False)) for _ in range(3)])
    text = metrics.render()
    assert "serve_generated_tokens_total 12" in text
    assert 'serve_request_seconds_bucket{le="+Inf"} 3' in text
    assert "# TYPE serve_time_to_first_token_seconds histogram" in text


def test_sampling_a_row_ignores_its_neighbours():
    torch.manual_seed(0)
    logits = torch.randn(4, 1000)
    params = [SamplingParams(temperature=0.8, top_k=50), SamplingParams(temperature=0.0),
              SamplingParams(temperature=1.0, top_p=0.5), SamplingParams(temperature=0.8, top_k=50)]
    gens = lambda: [torch.Generator().manual_seed(i) for i in range(4)]
    together = sample_rows(logits, params, gens())
    alone = [sample_rows(logits[i:i + 1], [params[i]], [gens()[i]])[0] for i in range(4)]
    assert together == alone
    assert together[1] == int(logits[1].argmax())
    # Top-k keeps only the 50 best tokens.
    assert together[0] in torch.topk(logits[0], 50).indices.tolist()


def test_sampling_follows_the_distribution():
    logits = torch.log(torch.tensor([[0.1, 0.6, 0.3, 0.0]]))
    g = torch.Generator().manual_seed(0)
    draws = [sample_rows(logits, [SamplingParams(temperature=1.0)], [g])[0] for _ in range(3000)]
    counts = [draws.count(t) / len(draws) for t in range(4)]
    assert counts[3] == 0
    assert counts == pytest.approx([0.1, 0.6, 0.3, 0.0], abs=0.03)


def test_text_assembler_holds_back_partial_stop_strings_and_characters():
    from data.tokenizer import encode
    text = "Hello world. The end"
    assembler = TextAssembler(stop=["world."])
    released = ""
    for token in encode(text):
        released += assembler.add(token)
        if assembler.stopped:
            break
    assert assembler.stopped and assembler.text == "Hello " and released == "Hello "
    # A multi-byte character split across tokens is released only once complete.
    assembler = TextAssembler(stop=[])
    pieces = [assembler.add(t) for t in encode("naïve 🙂 ok")]
    assert "\ufffd" not in "".join(pieces)
    assert "".join(pieces) + assembler.finish() == "naïve 🙂 ok"


def test_a_failing_request_ends_alone_and_its_batch_completes_as_if_alone(engine, monkeypatch):
    """A request whose token handling fails (here: its text assembly) gets an error without internal text;
    the greedy requests decoded in the same steps finish with the tokens they get alone."""
    greedy = SamplingParams(max_new_tokens=6, temperature=0)
    prompts = [[5, 6, 7], [9, 10], [11, 12, 13, 14]]
    alone = [run(engine, [(ids, greedy)]).tokens[0] for ids in prompts]

    class PoisonedText(TextAssembler):
        def add(self, token):
            if self.stop == ["poison"] and len(self.tokens) == 2:
                raise KeyError(f"Invalid token for decoding: {token}")
            return super().add(token)

    monkeypatch.setattr("decode.row_state.TextAssembler", PoisonedText)
    collector = Collector(4)
    for i, ids in enumerate(prompts):
        engine.submit(GenerationRequest(ids, greedy, collector.callback(i)))
    engine.submit(GenerationRequest([1, 2], greedy, collector.callback(3), stop=["poison"]))
    collector.wait()
    assert collector.tokens[:3] == alone and all(isinstance(collector.ends[i], DoneEvent) for i in range(3))
    failure = collector.ends[3]
    assert isinstance(failure, ErrorEvent) and "KeyError" not in failure.message and "Invalid" not in failure.message


def test_a_request_whose_sampling_fails_ends_alone_and_its_batch_completes_as_if_alone(engine, monkeypatch):
    """The sampler fails for one request in the middle of a batched step, after every row drew its token:
    that request gets an error without internal text; the others (greedy, and seeded sampling, whose
    generators must be rewound) finish with the tokens they get alone."""
    others = [([5, 6, 7], SamplingParams(max_new_tokens=6, temperature=0, stop_at_eot=False)),
              ([9, 10], SamplingParams(max_new_tokens=6, temperature=0, stop_at_eot=False)),
              ([11, 12, 13], SamplingParams(max_new_tokens=6, temperature=0.9, seed=3, stop_at_eot=False))]
    alone = [run(engine, [job]).tokens[0] for job in others]
    poison = SamplingParams(max_new_tokens=6, temperature=0.8, seed=5, stop_at_eot=False)
    batch_sizes_with_poison = []

    def poisoned(logits, params, generators, generated):
        tokens = sample_rows_on_device(logits, params, generators, generated)  # every row draws first, as a late
        # failure would
        if any(p is poison for p in params):
            batch_sizes_with_poison.append(len(params))
            if len(batch_sizes_with_poison) > 2:  # prefill and the first decode step pass: it fails mid-batch
                raise FloatingPointError("poisoned logits")
        return tokens

    monkeypatch.setattr("serve.sampled_step.sample_rows_on_device", poisoned)
    together = run(engine, [*others, ([1, 2], poison)])
    assert together.tokens[:3] == alone and all(isinstance(together.ends[i], DoneEvent) for i in range(3))
    failure = together.ends[3]
    assert isinstance(failure, ErrorEvent) and failure.kind == "internal"
    assert "poisoned" not in failure.message and "FloatingPointError" not in failure.message
    assert len(together.tokens[3]) == 2 and batch_sizes_with_poison[2] == 4  # it failed inside the batch of four


@pytest.mark.parametrize("fill", [float("inf"), 3e38])
def test_huge_or_infinite_logits_are_drawn_not_overflowed(fill):
    """Logits far beyond float32's range once divided by the temperature still name their best token."""
    logits = torch.randn(2, 1000)
    logits[:, 7] = fill
    for settings in (dict(temperature=0.5), dict(temperature=2e-4), dict(temperature=0.7, top_k=5),
                     dict(temperature=1.0, top_p=0.5)):
        generators = [torch.Generator().manual_seed(i) for i in range(2)]
        tokens = sample_rows(logits, [SamplingParams(**settings)] * 2, generators)
        assert tokens == [7, 7], settings


def test_a_vanishing_top_p_keeps_the_best_token():
    """top_p = 1e-300 rounds to 0 in float32; the nucleus is then the best token alone, not nothing."""
    torch.manual_seed(0)
    logits = torch.randn(3, 1000)
    tokens = sample_rows(logits, [SamplingParams(temperature=1.0, top_p=1e-300)] * 3,
                         [torch.Generator().manual_seed(i) for i in range(3)])
    assert tokens == logits.argmax(-1).tolist()


@pytest.mark.parametrize("ids, params, message", [
    ([], SamplingParams(max_new_tokens=2), "the prompt holds no tokens"),
    ([1] * 10, SamplingParams(max_new_tokens=7), "the prompt's 10 tokens and 7 new ones exceed the model's context "
                                                 "of 16"),
    ([1, 2048], SamplingParams(max_new_tokens=2), "the prompt names a token id outside the model's vocabulary of 2048"),
    ([1, -1], SamplingParams(max_new_tokens=2), "the prompt names a token id outside"),
    ([1], SamplingParams(max_new_tokens=2, logit_bias=((2048, 1.0),)), "the logit_bias names a token id outside"),
])
def test_the_engine_refuses_at_submission_a_request_its_model_cannot_run(short_context_model, ids, params, message):
    from serve.engine import RequestRejected
    engine = Engine(short_context_model, torch.device("cpu"), max_batch_size=1, max_queue=1, request_timeout_s=60)
    with pytest.raises(RequestRejected, match=message):
        engine.submit(GenerationRequest(ids, params, lambda event: None))
    assert engine.queue_depth == 0


def test_after_warm_up_no_batch_waits_for_a_trace(short_context_model, monkeypatch):
    """Issue 49: start-up makes the step of every row count the batch is padded to, in the form the batch runs it
    (rows of one length included), so no request pays for a trace."""
    torch.manual_seed(1)
    model = GPT(small_config(block_size=16, vocab_size=2048)).eval()  # traces are kept per model: a fresh one
    engine = Engine(model, torch.device("cpu"), max_batch_size=6, max_queue=8, request_timeout_s=60)
    passes = []  # a server keeps decoding: its weights go onto huge pages at start-up, not after many steps
    monkeypatch.setattr(huge_pages, "collapse_in_background", lambda: passes.append(1) or "asked")
    engine.warm_up()
    assert passes == [1]
    traced = engine.runner.steps.traced
    made = set(traced.traces)
    # 5 rows run padded to 6; 2 to 4 rows of one length run aligned too (serve/runner.py's ALIGNED_ROWS)
    assert sorted(key[0] for key in made) == [1, 2, 2, 3, 3, 4, 4, 6]
    engine.start()
    try:
        greedy = SamplingParams(max_new_tokens=5, temperature=0, stop_at_eot=False)
        alone = run(engine, [([1, 2, 3], greedy)]).tokens[0]
        # Six rows of one length, then five of several lengths, join and leave together.
        together = run(engine, [([1, 2, 3], greedy)] * 6).tokens
        run(engine, [([i + 1] * (i + 1), greedy) for i in range(5)])
    finally:
        engine.stop()
    assert together == [alone] * 6
    assert set(traced.traces) == made


def test_a_warm_up_that_fails_fails_the_start(short_context_model, monkeypatch):
    """The warm-up runs on the engine's thread (its per-thread costs are the first request's otherwise); a failure
    there reaches whoever starts the engine, as a model that cannot be traced must fail the server's start-up."""
    def broken(runner, all_rows):
        raise RuntimeError("cannot trace this model")

    monkeypatch.setattr("serve.engine.warm_up", broken)
    engine = Engine(short_context_model, torch.device("cpu"), max_batch_size=2, max_queue=2, request_timeout_s=60)
    with pytest.raises(RuntimeError, match="cannot trace this model"):
        engine.start(warm_up_all_rows=True)
    assert not engine.thread.is_alive()


def test_a_batch_whose_sampling_fails_gives_each_row_its_own_token_again(monkeypatch):
    """Rows sampled again one at a time after a failed batch draw from their generators as they stood before it:
    the rows that draw get the tokens the batch would have given them, and greedy rows (whose generator states are
    not kept: they draw nothing) their argmax."""
    from serve import sampled_step
    from serve.sequence import Sequence

    settings = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.9, seed=1),
                SamplingParams(temperature=0.0), SamplingParams(temperature=1.2, top_k=40, seed=2)]
    torch.manual_seed(0)
    logits = torch.randn(4, 1000)

    def sequences():
        return [Sequence(GenerationRequest([1], params, lambda event: None), torch.device("cpu"), 0.0, False)
                for params in settings]

    expected, none_failed = sampled_step.sample_sequences(logits, sequences())
    assert none_failed == set()

    def fails_for_a_batch(logits, params, generators, generated):
        tokens = sample_rows_on_device(logits, params, generators, generated)  # the generators move on, as in a
        # late failure
        if len(params) > 1:
            raise FloatingPointError("the batch fails")
        return tokens

    monkeypatch.setattr(sampled_step, "sample_rows_on_device", fails_for_a_batch)
    again, none_failed = sampled_step.sample_sequences(logits, sequences())
    assert again.tolist() == expected.tolist() and none_failed == set()
