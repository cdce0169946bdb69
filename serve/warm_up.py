"""Start-up's warm-up of a server's Runner: every one-time cost paid before /health says ready, so that the first
requests run as fast as the tenth (issue 49; `python -m bench.experiments first_request` measures it)."""
from __future__ import annotations

import logging
import time
from typing import Callable

import torch

from decode import sampling
from decode.sampling import SamplingParams
from decode.steps import DecodeSteps
from model.kv_cache import KVCache
from runtime import huge_pages
from serve.runner import ALIGNED_ROWS, Runner
from serve.slots import padded_rows

log = logging.getLogger("serve.engine")

# Runs of each step made at start-up after its trace's own two (`_warm_step`).
WARM_UP_STEPS = 8
# A warm-up prompt's length: any runs the same eager pass (a model whose context is shorter takes one as long as it).
WARM_UP_PROMPT_TOKENS = 8
# How long start-up waits at most for the pass that moves the weights onto huge pages (lowest priority, so slow on
# a busy host); beyond it the server starts anyway and logs that the pass still runs.
HUGE_PAGES_SETTLE_S = 60.0


def warm_up(runner: Runner, all_rows: bool = True) -> None:
    """Pay every one-time cost now, before /health says ready, so that the first requests run as fast as the
    tenth (issue 49): the traces or CUDA-graph captures of the steps a batch can run, with their first runs
    (a model that cannot be traced or captured fails here, at startup), an eager prompt pass and both ways of
    sampling, and the pass that moves the weights onto huge pages (runtime/huge_pages.py), which would
    otherwise run beside the first requests.

    The steps made: plain decoding, one per row count the batch is padded to (`padded_rows`: 1-4, then
    multiples of 4 up to the largest batch; the one-row step alone without `all_rows`), each in the form the batch
    runs it (`step` keeps every batch of several rows in the ragged form, rows at their own columns), and traced,
    the aligned form of 2 to ALIGNED_ROWS rows of one length (serve/runner.py's `_aligned`); with a draft, the
    one-row steps only (the speculative check of K + 1 tokens and the draft's one-token step), as speculative
    batches are not padded and every row count would need traces of its own.  They run on the free rows of the
    empty caches, which joining sequences overwrite."""
    started = time.perf_counter()
    if runner.config.block_size < 2:  # any prompt fills the context: no decode step can ever run
        pass
    elif runner.draft is None:
        counts = {padded_rows(active, runner.max_batch_size) for active in range(1, runner.max_batch_size + 1)}
        for rows in sorted(counts) if runner.steps.compiled and all_rows else [1]:
            if rows > 1:  # the batch's form: row 0 holds a column, the others (as free rows) none
                runner.slots.views(1)[0][0].advance(1)
            _warm_step(runner, runner.steps, lambda: runner.slots.views(rows)[0][0], 1)
            runner.slots.clear_free_rows()
        if runner.steps.mode == "traced" and all_rows:  # and the aligned form of a few rows of one length
            for rows in range(2, min(ALIGNED_ROWS, runner.max_batch_size) + 1):
                _warm_step(runner, runner.steps, lambda: runner.slots.views(rows)[0][0], 1)
                runner.slots.clear_free_rows()
    else:
        for i, (steps, width) in enumerate(zip(runner.all_steps, [runner.draft_tokens + 1, 1])):
            _warm_step(runner, steps, lambda: runner.slots.views(1)[0][i], width)
        runner.slots.clear_free_rows()
    for steps in runner.all_steps:  # the build thread's count back, as the steps may have changed it
        steps.release_threads()
    _warm_prompt_and_sampling(runner)
    if runner.device.type == "cpu":  # a server keeps decoding: its weights go onto huge pages now, not after a while
        log.info("%s", huge_pages.collapse_in_background())
    settled = huge_pages.settled(HUGE_PAGES_SETTLE_S)
    log.info("warmed up in %.1fs: %s", time.perf_counter() - started,
             "weights settled" if settled else f"huge-page pass still running after {HUGE_PAGES_SETTLE_S:g}s")

def _warm_step(runner: Runner, steps: DecodeSteps, cache: Callable[[], KVCache], width: int) -> None:
    """Make the step of `width` tokens per row over `cache()`'s rows, then run it a few times more: TorchScript's
    executor optimizes a traced graph again for the first few cache lengths it meets (each such step is slower
    than a settled one: bench/results/first_request.json), so those runs are start-up's, not a request's."""
    steps.prepare(cache(), width)
    for _ in range(WARM_UP_STEPS):
        view = cache()
        if view.length + width > view.max_len:
            break
        steps.logits(view, torch.zeros(view.lengths.numel(), width, dtype=torch.long, device=runner.device), width)

def _warm_prompt_and_sampling(runner: Runner) -> None:
    """A prompt's eager pass and a draw of both kinds (greedy, and top-k with top-p) on its logits."""
    length = min(WARM_UP_PROMPT_TOKENS, runner.config.block_size)
    prompt = torch.zeros(1, length, dtype=torch.long, device=runner.device)
    logits = runner.steps.logits(runner.steps.new_cache(1, length), prompt, 1)[:, -1]
    generator = torch.Generator(device=runner.device).manual_seed(0)
    # decode/sampling.py's own sampler, the one the runner calls (its tokens left on the device), through this module's
    # name.
    sampling.sample_rows_on_device(logits.expand(2, -1),
                                   [SamplingParams(temperature=0), SamplingParams(top_k=40, top_p=0.9)],
                                   [generator, generator], [[], []])
