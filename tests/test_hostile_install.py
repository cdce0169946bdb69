"""make setup's reading of pip's configuration (runtime/install.py) under the hostile-input property
(tests/hostile.py): any text `pip config list` might print is either read into settings of strings, whose flags for
uv are strings, or refused with one line naming the line it could not read; never a traceback."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from runtime import install
from tests.hostile import attempt, examples

SURFACE = "pip config"
KEYS = st.sampled_from([*install.LIST_FLAGS, *install.ONE_FLAGS, *install.SWITCHES, "cert", "timeout", "bad key"])
SCOPES = st.sampled_from([*install.SCOPES, "download", "", "a.b"])
VALUES = st.one_of(st.text(max_size=40).map(repr), st.text(max_size=40), st.integers().map(str),
                   st.lists(st.text(max_size=8), max_size=3).map(repr))
LINES = st.one_of(st.builds(lambda scope, key, value: f"{scope}.{key}={value}", SCOPES, KEYS, VALUES),
                  st.text(max_size=60))


@examples(60)
@given(lines=st.lists(LINES, max_size=6))
def test_any_listing_is_read_or_refused_with_one_line(lines):
    def read():
        flags, env = install.uv_flags(install.pip_settings("\n".join(lines)))
        assert all(isinstance(word, str) for word in [*flags, *env.values()])
    attempt(SURFACE, read)
