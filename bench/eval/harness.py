"""lm-evaluation-harness against `python -m serve`, unchanged, and item by item against our own scoring.

    python bench/eval/harness.py --lm-eval /path/to/venv/bin/lm_eval --checkpoint out/demo/train

lm-eval is not a dependency of the project: install it anywhere with its API backends (`python -m venv /tmp/lm &&
/tmp/lm/bin/pip install torch==2.13.0 'lm-eval[api]==0.4.13'`: the `api` extra brings the `local-completions`
backend's tenacity, aiohttp and tiktoken) and pass its `lm_eval`.  The result goes to out/harness.json unless
`--out` says otherwise (bench/results/harness.json is the committed one).  This script writes a small cloze task
(context, next word) from the built-in corpus's validation split as a local JSONL task, fills tiktoken's
cache with the project's tokenizer (`data.fetch_tokenizer`), serves the checkpoint as `gpt2` (a name tiktoken
maps to GPT-2's encoding), runs the harness's `local-completions` backend with token-id prompts, and scores
every item again with `training/evaluate.py`: the log-likelihood of the continuation given the context, split
into tokens as the harness splits them.  The result names both versions, the task's score and the largest
per-item difference.
"""
from __future__ import annotations

import json
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.processes import run_command
from data.corpus import builtin_documents
from data.tiktoken_cache import fill_cache
from data.tokenizer import get_tokenizer, ranks_file
from training.evaluate import evaluate_loss
from runtime.cli import check_options, entry_point, option, parse_config
from runtime.errors import UserError
from runtime.provenance import git_commit
from serve.launch import running_server
from storage.artifact import load_model
from storage.run_folder import pick_checkpoint

TASK = "cloze_builtin"


class HarnessError(UserError):
    pass


@dataclass
class HarnessConfig:
    lm_eval: str = option("lm_eval", "the lm_eval command of an environment where lm-eval is installed")
    checkpoint: str | None = option(None, "the artifact to serve and score (default: the train.py checkpoint under out/ trained on the most tokens)")
    items: int = option(50, "cloze items: a sentence's words, then its last word", min=1)
    out: str = option("out/harness.json", "where to write the result (the committed one is "
                                          "bench/results/harness.json)")

    def __post_init__(self):
        check_options(self, HarnessError)


def cloze_items(count: int) -> list[dict]:
    """Sentences of 8 to 30 words from the built-in validation text: the words before the last as the
    context, the last word (without its full stop) as the continuation."""
    items = []
    for document in builtin_documents("validation"):
        for sentence in re.split(r"(?<=\.)\s+", " ".join(document.split())):
            words = sentence.rstrip(".").split()
            if sentence.endswith(".") and 8 <= len(words) <= 30 and words[-1].isalpha():
                items.append({"context": " ".join(words[:-1]), "continuation": words[-1]})
                if len(items) == count:
                    return items
    raise HarnessError(f"the built-in validation text has fewer than {count} usable sentences")


def task_files(folder: Path, items: list[dict]) -> None:
    (folder / "items.jsonl").write_text("".join(json.dumps(item) + "\n" for item in items))
    (folder / f"{TASK}.yaml").write_text(
        f"task: {TASK}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {folder / 'items.jsonl'}\n"
        "test_split: test\noutput_type: loglikelihood\ndoc_to_text: \"{{context}}\"\n"
        "doc_to_target: \" {{continuation}}\"\nmetric_list:\n  - metric: perplexity\n    aggregation: perplexity\n"
        "    higher_is_better: false\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n")


def our_scores(checkpoint: str, items: list[dict]) -> list[tuple[float, bool]]:
    """(log-likelihood, greedy) per item, with the harness's split: the context's tokens, then the tokens
    the joined text adds (the task's target is the continuation after one space, as lambada's is)."""
    model, _ = load_model(checkpoint)
    tokenizer = get_tokenizer()
    scores = []
    for item in items:
        context = tokenizer.encode_ordinary(item["context"])
        whole = tokenizer.encode_ordinary(item["context"] + " " + item["continuation"])
        continuation = whole[len(context):]
        x = torch.tensor([whole[:-1]])
        y = torch.full_like(x, -1)
        y[0, len(context) - 1:] = torch.tensor(continuation)
        loss = evaluate_loss(model, [(x, y)], "cpu")
        with torch.no_grad():
            greedy = model(x)[0][0, len(context) - 1:].argmax(-1).tolist() == continuation
        scores.append((-loss["val_loss"] * loss["val_tokens"], greedy))
    return scores


def run_harness(cfg: HarnessConfig, work: Path, url: str, cache: Path) -> tuple[dict, list[dict], str]:
    command = [cfg.lm_eval, "--model", "local-completions", "--model_args",
               f"model=gpt2,base_url={url}/v1/completions,tokenizer_backend=tiktoken,num_concurrent=1",
               "--tasks", TASK, "--include_path", str(work), "--output_path", str(work / "out"), "--log_samples",
               "--batch_size", "1"]
    # lm-eval's own environment, not ours: only what it needs, and its path as the user gave it.
    env = {"TIKTOKEN_CACHE_DIR": str(cache), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "PATH": "/usr/bin:/bin"}
    try:
        run = run_command(command, cwd=None, base_env=env, timeout_s=1800)
    except FileNotFoundError as e:
        raise HarnessError(f"--lm-eval {cfg.lm_eval} cannot be run ({e}); install lm-eval and pass its lm_eval")
    if run.returncode is None:
        raise HarnessError(f"lm_eval did not finish in {run.seconds / 60:.0f} minutes:\n{run.stderr[-3000:]}")
    if not run.ok:
        raise HarnessError(f"lm_eval failed (exit {run.returncode}):\n{run.stderr[-3000:]}")
    results = json.loads(next((work / "out").rglob("results_*.json")).read_text())
    samples = [json.loads(line) for line in next((work / "out").rglob(f"samples_{TASK}_*.jsonl")).open()]
    return results, sorted(samples, key=lambda s: s["doc_id"]), lm_eval_version(cfg.lm_eval)


def lm_eval_version(lm_eval: str) -> str:
    """What pip in lm_eval's own environment says of the package's version ("" when it cannot tell)."""
    shown = run_command([str(Path(lm_eval).with_name("python")), "-m", "pip", "show", "lm_eval"], cwd=None).stdout
    return next((line.split(":", 1)[1].strip() for line in shown.splitlines() if line.startswith("Version:")), "")


def say(what: str) -> None:
    print(what, file=sys.stderr, flush=True)


def harness(cfg: HarnessConfig) -> dict:
    folder, why = pick_checkpoint(cfg.checkpoint)
    say(f"harness: model {folder} ({why})")
    items = cloze_items(cfg.items)
    say(f"harness: {len(items)} cloze items from the built-in validation split")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        task_files(work, items)
        cache = work / "tiktoken-cache"
        get_tokenizer()  # says how to fetch the ranks file when it is missing
        fill_cache(ranks_file(), cache)
        say(f"harness: starting `python -m serve` on {folder}")
        with running_server(folder, work / "server.log", ["--served-model-name", "gpt2"]) as server:
            say(f"harness: server at {server.url}; running {cfg.lm_eval} (its start-up alone takes some 20 s)")
            started = time.perf_counter()
            results, samples, version = run_harness(cfg, work, server.url, cache)
            say(f"harness: lm-eval {version} scored {len(samples)} items in {time.perf_counter() - started:.0f} s")
    say("harness: scoring the same items with training/evaluate.py")
    ours = our_scores(str(folder), items)
    theirs = [(float(s["resps"][0][0][0]), str(s["resps"][0][0][1]) == "True") for s in samples]  # logged as text
    differences = [abs(a[0] - b[0]) for a, b in zip(ours, theirs)]
    metrics = results["results"][TASK]
    return {
        "task": {"name": TASK, "items": len(items), "source": "built-in corpus, validation split: a sentence's words, "
                 "then its last word", "first_item": items[0]},
        "harness": {"lm_eval": version, "backend": "local-completions, tokenizer_backend=tiktoken, token-id prompts",
                    "acc": metrics.get("acc,none"), "perplexity": metrics.get("perplexity,none")},
        "agreement": {"items_compared": len(differences), "max_abs_loglikelihood_difference": max(differences),
                      "greedy_flags_equal": sum(a[1] == b[1] for a, b in zip(ours, theirs)),
                      "ours": "training/evaluate.py evaluate_loss on the harness's token split"},
        "checkpoint": str(folder), "torch": torch.__version__, "git_commit": git_commit(),
        "command": " ".join(["python bench/eval/harness.py", *sys.argv[1:]]),
    }


@entry_point
def main(argv=None) -> None:
    cfg = parse_config(HarnessConfig, __doc__, argv)
    result = harness(cfg)
    Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
    Path(cfg.out).write_text(json.dumps(result, indent=2) + "\n")
    agreement = result["agreement"]
    print(f"{TASK}: acc {result['harness']['acc']:.3f}, perplexity {result['harness']['perplexity']:.2f} "
          f"(lm-eval {result['harness']['lm_eval']}); per item, largest log-likelihood difference from "
          f"training/evaluate.py {agreement['max_abs_loglikelihood_difference']:.2e}, greedy flags equal "
          f"{agreement['greedy_flags_equal']}/{agreement['items_compared']}; wrote {cfg.out}")


if __name__ == "__main__":
    main()
