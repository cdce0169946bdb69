"""make setup's installer (runtime/install.py): pip's package sources on this host handed to uv as flags, the
strongest scope winning, and pip installing the requirements where uv cannot, after one line saying why."""
from __future__ import annotations

from pathlib import Path

import pytest

from runtime import install

LISTING = """\
:env:.find-links='/opt/wheels'
:env:.default-timeout='180'
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/somewhere/else'
global.index-url='https://pypi.example/simple'
install.index-url='https://mirror.example/simple'
download.index-url='https://not-for-install.example/simple'
install.no-index='false'
"""


def test_pips_sources_become_uvs_flags_the_environment_over_install_over_global():
    settings = install.pip_settings(LISTING)
    assert settings["find-links"] == "/opt/wheels" and settings["index-url"] == "https://mirror.example/simple"
    flags, env = install.uv_flags(settings)
    assert flags == ["--index-strategy", "unsafe-best-match", "--index-url", "https://mirror.example/simple",
                     "--find-links", "/opt/wheels", "--extra-index-url", "file:///opt/pypi/simple",
                     "--extra-index-url", "file:///opt/pypi-more/simple", "--constraints",
                     "/etc/xdg/pip/constraints.txt"]
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt"}


def test_a_blank_line_is_passed_over_and_a_later_line_of_the_same_scope_wins():
    settings = install.pip_settings("global.index-url='https://first.example/simple'\n\n"
                                    "global.index-url='https://later.example/simple'\n")
    assert settings == {"index-url": "https://later.example/simple"}


def test_switches_are_passed_when_pip_has_them_on():
    flags, env = install.uv_flags(install.pip_settings("global.no-index='true'\n:env:.pre='1'\n"))
    assert flags[-2:] == ["--no-index", "--prerelease=allow"] and env == {}


@pytest.mark.parametrize("line", ["find-links='/opt/wheels'", "global.find-links=/opt/wheels",
                                  "global.find-links=['/opt/wheels']", "global.find-links='unclosed",
                                  "global.find-links='" + "\\N{NO SUCH NAME}'", "global.find-links=" + "(" * 10**5])
def test_a_listing_line_it_cannot_read_is_named(line):
    with pytest.raises(install.ConfigError, match="pip config list"):
        install.pip_settings(line)


def test_where_uv_fails_pip_installs_the_same_requirements_after_one_line(monkeypatch, capsys):
    installed = []

    def uv_fails(python, requirements):
        raise RuntimeError("`uv pip install --quiet ...` failed: no solution found")

    monkeypatch.setattr(install, "with_uv", uv_fails)
    monkeypatch.setattr(install, "with_pip", lambda python, requirements: installed.append((python, requirements)))
    install.main([".venv/bin/python", "-r", "requirements.txt", "-r", "requirements-test.txt"])
    assert installed == [(Path(".venv/bin/python"), ["-r", "requirements.txt", "-r", "requirements-test.txt"])]
    said = capsys.readouterr().err.strip().splitlines()
    assert said == ["make setup: uv could not install the requirements (`uv pip install --quiet ...` failed: no "
                    "solution found); installing them with pip instead"]


def test_a_failed_install_is_one_error_line_and_a_failing_status(monkeypatch):
    def fails(python, requirements):
        raise RuntimeError("`x -m pip install ...` failed: no matching distribution")

    monkeypatch.setattr(install, "with_uv", fails)
    monkeypatch.setattr(install, "with_pip", fails)
    with pytest.raises(SystemExit) as stopped:
        install.main([".venv/bin/python", "-r", "requirements.txt"])
    assert stopped.value.code == ("error: `x -m pip install ...` failed: no matching distribution; the requirements "
                                  "files name what make setup installs")
