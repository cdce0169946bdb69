"""Poison request: a request with temperature 7.3e-39 (its scaled logits overflow) is batched with greedy ones; a
failure is any greedy answer that differs from its answer alone, or a 500 or internal text.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from bench.drills.drill import Drill, DrillSettings, small_artifact
from serve.launch import running_server


def run(s: DrillSettings, work: Path) -> Drill:
    failures, notes = 0, []
    greedy = [{"prompt": f"drill {i}", "max_new_tokens": 24, "temperature": 0} for i in range(s.greedy_per_batch)]
    poisons = [{"prompt": "poison", "max_new_tokens": 24, "temperature": 7.3e-39},
               {"prompt": "poison", "max_new_tokens": 24, "top_p": 1e-300, "temperature": 1.0},
               {"prompt": "poison", "max_new_tokens": 24, "temperature": 5e-324}]
    with running_server(small_artifact(work / "serve-model"), work / "poison-server.log") as server:
        post = lambda body: httpx.post(f"{server.url}/generate", json=body, timeout=60)
        alone = [post(body).json()["text"] for body in greedy]
        for trial in range(s.poison_batches):
            poison = poisons[trial % len(poisons)]
            with ThreadPoolExecutor(len(greedy) + 1) as pool:
                replies = list(pool.map(post, [poison, *greedy]))
            together = [r.json().get("text") if r.status_code == 200 else None for r in replies[1:]]
            leaked = replies[0].status_code >= 500 or any(w in replies[0].text for w in ("Traceback", "KeyError"))
            if together != alone or leaked:
                failures += 1
                notes.append(f"trial {trial}: poison answered {replies[0].status_code} {replies[0].text[:120]}; "
                             f"greedy rows equal to alone: {together == alone}")
    return Drill("poison request in a greedy batch", s.poison_batches, failures, "-", notes=notes)
