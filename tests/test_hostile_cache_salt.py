"""The `cache_salt` field (issue 69) under the hostile-input property (tests/hostile.py): on /generate and
/v1/completions, any value is either taken (a string of 1 to MAX_CACHE_SALT_CHARS characters, NULs included: the
salt is hashed, never printed) or refused (lone surrogates too, which are no Unicode text) with a 422 whose one line names `cache_salt`; never a
server error."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from serve.app import create_app
from serve.config import ServeConfig
from serve.schemas import MAX_CACHE_SALT_CHARS
from tests.conftest import save_small_artifact
from tests.hostile import check_error_line, examples, record

SURFACE = "http"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    checkpoint = save_small_artifact(tmp_path_factory.mktemp("artifact") / "tiny", block_size=64)
    with TestClient(create_app(ServeConfig(checkpoint=checkpoint, device="cpu", warm_up="one-row")),
                    raise_server_exceptions=False) as client:
        client.model_id = Path(checkpoint).name
        yield client


def bodies(client, salt) -> dict[str, dict]:
    return {"/generate": {"prompt": "Hello there", "max_new_tokens": 1, "cache_salt": salt},
            "/v1/completions": {"model": client.model_id, "prompt": [1, 2, 3], "max_tokens": 1, "cache_salt": salt}}


def check(client, salt) -> None:
    for path, body in bodies(client, salt).items():
        # Sent as the bytes a client would send, lone surrogates escaped as JSON allows.
        response = client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
        taken = salt is None or (isinstance(salt, str) and 1 <= len(salt) <= MAX_CACHE_SALT_CHARS
                                 and not any("\ud800" <= c <= "\udfff" for c in salt))
        assert response.status_code == (200 if taken else 422), (path, salt, response.text[:300])
        if not taken:
            error = response.json()["error"]
            check_error_line(error["message"], SURFACE)
            assert error["param"] == "cache_salt" and "cache_salt" in error["message"], error
        record(SURFACE, "worked" if taken else "refused", f"{path} cache_salt")


@pytest.mark.parametrize("salt", ["", "x" * (MAX_CACHE_SALT_CHARS + 1), "x" * MAX_CACHE_SALT_CHARS, 7, 1.5, True,
                                  [], ["a"], {"a": 1}, None, "\ud800", "a\u0000b", "\U0001F600" * 10])
def test_edge_salts_are_taken_or_named(client, salt):
    check(client, salt)


@examples(15)
@given(salt=st.one_of(st.text(max_size=MAX_CACHE_SALT_CHARS + 8), st.integers(), st.floats(allow_nan=False),
                      st.booleans(), st.none(), st.lists(st.text(max_size=3), max_size=2)))
def test_drawn_salts_are_taken_or_named(client, salt):
    check(client, salt)
