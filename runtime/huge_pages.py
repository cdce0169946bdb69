"""The weights a CPU decoding step streams, moved onto huge pages (Linux's transparent huge pages) in the background.

A decoding step reads every weight once per token. On the x86 base page size that is a new page every few thousand
bytes of weights, and the processor's page-table cache holds far fewer pages than a model has, so the step also
walks page tables all the way through; on huge pages (HUGE_PAGE) it walks 512 times less often. Linux gives such
pages to memory that asks for them (madvise) under its most common setting, `madvise`, but the libraries that hold
our weights (PyTorch's allocator, oneDNN's packed copies, fbgemm's packed int8 weights) never ask. So, once the
weights are in place, this asks for them: every large anonymous mapping of the process that is almost all resident
(the weights, their packed copies, the KV cache) is advised (MADV_HUGEPAGE) and collapsed (MADV_COLLAPSE, Linux 6.1
and later; before that the kernel's khugepaged collapses advised memory at its own pace).

Collapsing copies the memory into new pages, so it runs on a thread of its own at the lowest priority; even so it
slows the steps beside it (their threads wait for the core it holds, and both read memory), and a one-off call of a
few hundred tokens ends before the faster steps repay that (bench/by_hand.md, "huge pages for a one-off call").
So decode/trace.py starts it once a set of weights has run HUGE_PAGES_AFTER_STEPS traced steps in the process, as
the packed copies every step reads exist from the first trace on, and the server's warm-up starts it at once. What
it saves a step: `python -m bench.experiments generate_speed`, whose sides are kept-loaded processes, as a server's
is. Tokens are unchanged: only the pages under the same bytes change. A pass contends with the process's other
threads for its memory map, so none is started under load.
"""
from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading

log = logging.getLogger(__name__)

MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25
HUGE_PAGE = 2 << 20
# A mapping is moved only when this much of it is resident: collapsing fills a huge page's missing small pages,
# and a sparse mapping (a heap with holes, a cache allocated but unwritten) would grow by them.
RESIDENT_SHARE = 0.9
SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"

_lock = threading.Lock()
_thread: threading.Thread | None = None
_again = threading.Event()
_idle = threading.Event()  # set while no pass is due or running
_idle.set()
_asked = 0  # the passes asked for so far in this process (collapse_in_background's calls)


def thp_setting() -> str | None:
    """Linux's transparent huge page setting (always, madvise or never), or None where there is none."""
    try:
        text = open(SETTING).read()
    except OSError:
        return None
    chosen = text[text.find("[") + 1:text.find("]")] if "[" in text else ""
    return chosen or None


def smaps() -> list[dict]:
    """The process's mappings from /proc/self/smaps: start, end, perms, path, and the sizes in bytes it lists
    (`Rss:`, `AnonHugePages:`, ...)."""
    found = []
    with open("/proc/self/smaps") as lines:
        for line in lines:
            head = line.split(None, 1)[0]
            if "-" in head and not head.endswith(":"):  # a mapping's first line: range perms offset dev inode [path]
                fields = line.split()
                start, end = (int(x, 16) for x in fields[0].split("-"))
                found.append({"start": start, "end": end, "perms": fields[1],
                              "path": fields[5] if len(fields) > 5 else ""})
            elif found and line.rstrip().endswith(" kB"):
                found[-1][head] = int(line.split()[1]) * 1024
    return found


def _resident_mappings() -> list[tuple[int, int]]:
    """(start, end) of the process's writable anonymous mappings, cut to whole huge pages, that are almost all
    resident and not yet on huge pages."""
    ranges = []
    for m in smaps():
        start, end = -(-m["start"] // HUGE_PAGE) * HUGE_PAGE, m["end"] // HUGE_PAGE * HUGE_PAGE
        size, resident = m["end"] - m["start"], m.get("Rss:", 0)
        if "w" in m["perms"] and m["path"] in ("", "[heap]") and end - start >= HUGE_PAGE \
                and resident >= RESIDENT_SHARE * size and m.get("AnonHugePages:", 0) < resident / 2:
            ranges.append((start, end))
    return ranges


def libc() -> ctypes.CDLL:
    """The C library, with madvise typed for addresses and lengths."""
    library = ctypes.CDLL(None, use_errno=True)
    library.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return library


def _collapse_all(libc) -> int:
    """Advise and collapse every mapping found; the bytes collapsed."""
    collapsed = 0
    for start, end in _resident_mappings():
        for chunk in range(start, end, 16 * HUGE_PAGE):  # small calls, so that a busy spell interrupts little
            length = min(16 * HUGE_PAGE, end - chunk)
            libc.madvise(chunk, length, MADV_HUGEPAGE)
            if libc.madvise(chunk, length, MADV_COLLAPSE) == 0:
                collapsed += length
    return collapsed


def _worker(libc) -> None:
    while True:
        _again.clear()
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # Linux's nice is per thread
            log.info("moved %d MiB of weights and caches onto huge pages", _collapse_all(libc) >> 20)
        except OSError as e:  # /proc unreadable (a sandbox): the pages stay as they are
            log.info("weights stay on small pages: %s", e)
        except Exception as e:  # anything else ends this pass alone: the weights stay where they are, still valid
            log.warning("huge pages: the pass stopped (%s: %s); the weights stay on the pages they have",
                        type(e).__name__, str(e).splitlines()[0] if str(e) else "no message")
        with _lock:  # a request that came during the pass keeps it due
            if not _again.is_set():
                _idle.set()
        _again.wait()  # until new weights are in place (another trace's packed copies)


def _forget_thread() -> None:
    global _thread
    _thread = None  # a forked child has no copy of the thread
    _idle.set()


os.register_at_fork(after_in_child=_forget_thread)


def collapse_in_background() -> str:
    """Start (or, with new weights in place since, restart) moving the process's resident weights onto huge pages
    in a lowest-priority thread; returns one line saying what is done."""
    global _thread, _asked
    _asked += 1
    if not sys.platform.startswith("linux"):
        return "weights stay on the system's pages (huge pages are asked of Linux only)"
    setting = thp_setting()
    if setting == "always":
        return "weights on huge pages already (transparent huge pages: always)"
    if setting != "madvise":
        return f"weights stay on small pages (transparent huge pages: {setting or 'not available'})"
    with _lock:
        _idle.clear()
        if _thread is None:
            _thread = threading.Thread(target=_worker, args=(libc(),), name="huge-pages", daemon=True)
            _thread.start()
        else:
            _again.set()
    return "moving the weights onto huge pages in the background (transparent huge pages: madvise)"


def passes_asked() -> int:
    """How many times this process has asked for a pass (collapse_in_background): a caller that asks only when no one
    else has since a point compares two counts."""
    return _asked


def settled(timeout: float) -> bool:
    """Wait until the weights asked for so far are on huge pages (or cannot be), up to `timeout` seconds: for a
    benchmark's warm-up, which times a kept-loaded process as it runs once its one-time set-up is done."""
    return _idle.wait(timeout)
