"""Reach the Hugging Face hub once, or not at all: offline, the `datasets` library reads its cache at once.

Without HF_HUB_OFFLINE, an unreachable hub costs every request its seconds of retries inside the hub client
(no argument of `load_dataset` shortens them), and a wikitext split makes several.  So the hub is asked once,
with a short timeout, and when it does not answer (or HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set) the load
runs in the libraries' offline mode: cached copies still load, and a missing one fails immediately.
"""
from __future__ import annotations

import contextlib
import os
import urllib.error
import urllib.request

OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
PROBE_TIMEOUT_S = 5


def offline_requested() -> bool:
    return any(os.environ.get(name, "").upper() in ("1", "ON", "YES", "TRUE") for name in OFFLINE_VARIABLES)


def hub_reachable() -> bool:
    """Whether the hub's endpoint answers one request (any HTTP status counts: the network works)."""
    from huggingface_hub import constants
    try:
        urllib.request.urlopen(urllib.request.Request(constants.ENDPOINT, method="HEAD"), timeout=PROBE_TIMEOUT_S)
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):  # URLError, timeouts, refused connections; ValueError: a malformed HF_ENDPOINT
        return False
    return True


@contextlib.contextmanager
def hub_offline():
    """Both libraries' offline mode for the calls inside.  They read HF_HUB_OFFLINE into these module
    constants when first imported and consult the constants on every request, so setting the variable now
    would come too late."""
    import datasets.config
    from huggingface_hub import constants
    saved = datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE = saved


def hub_access() -> tuple[contextlib.AbstractContextManager, str | None]:
    """The context to load from the hub in, and why it is offline (None when the hub is used)."""
    if offline_requested():
        return hub_offline(), f"{' or '.join(OFFLINE_VARIABLES)} is set"
    if not hub_reachable():
        from huggingface_hub import constants
        return hub_offline(), f"{constants.ENDPOINT} did not answer"
    return contextlib.nullcontext(), None
