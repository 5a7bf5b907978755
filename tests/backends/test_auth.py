"""Token authentication: a private token for raysoft's local Ray, a one-line refusal when a
joined cluster's token is missing, --token-file, and RAY_AUTH_MODE=disabled respected."""

from __future__ import annotations

import os
import stat

import pytest

from raysoft.backends import auth
from raysoft.config import ConfigError


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A home of its own and no token in the environment (RAY_AUTH_MODE as the user left it unset)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in (auth.MODE, auth.TOKEN, auth.TOKEN_PATH):
        monkeypatch.setenv(name, "")  # remembered, so that the end of the test restores it
        monkeypatch.delenv(name)
    # this process's Ray (the test session's) is left alone: only the variable is set
    monkeypatch.setattr(auth, "_enable_in_process", lambda: os.environ.__setitem__(auth.MODE, "token"))
    return tmp_path


def mode_of(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_local_ray_gets_a_private_token_when_none_exists(home):
    auth.prepare(None)
    token = home / ".ray" / "auth_token"
    assert mode_of(token) == 0o600 and len(token.read_text()) == 64
    assert os.environ[auth.MODE] == "token"
    first = token.read_text()
    auth.prepare(None)  # kept, not replaced
    assert token.read_text() == first


def test_a_readable_default_token_is_made_private(home):
    token = home / ".ray" / "auth_token"
    token.parent.mkdir()
    token.write_text("abc")
    os.chmod(token, 0o644)
    auth.prepare("127.0.0.1:6390")
    assert mode_of(token) == 0o600 and token.read_text() == "abc"


def test_joining_without_a_token_is_one_line_naming_where_to_put_it(home):
    with pytest.raises(ConfigError) as err:
        auth.prepare("10.0.0.5:6379")
    msg = str(err.value)
    assert "\n" not in msg and "joining 10.0.0.5:6379 needs the cluster's authentication token" in msg
    assert "RAY_AUTH_TOKEN" in msg and "--token-file" in msg
    assert not (home / ".ray").exists()  # nothing invented for someone else's cluster


def test_a_token_in_the_environment_or_a_file_is_used(home, monkeypatch):
    monkeypatch.setenv(auth.TOKEN, "xyz")
    auth.prepare("10.0.0.5:6379")
    monkeypatch.delenv(auth.TOKEN)
    f = home / "cluster.token"
    f.write_text("t0ken")
    auth.use_token_file(str(f))
    assert os.environ[auth.TOKEN_PATH] == str(f)
    auth.prepare("10.0.0.5:6379")
    with pytest.raises(ConfigError, match="--token-file: .* is not a file holding a token"):
        auth.use_token_file(str(home / "missing"))
    monkeypatch.setenv(auth.TOKEN_PATH, str(home / "missing"))
    with pytest.raises(ConfigError, match="RAY_AUTH_TOKEN_PATH"):
        auth.prepare("10.0.0.5:6379")


def test_auth_mode_disabled_is_the_users_choice(home, monkeypatch):
    monkeypatch.setenv(auth.MODE, "disabled")
    auth.prepare("10.0.0.5:6379")  # no refusal, no token written
    auth.prepare(None)
    assert not (home / ".ray").exists()


def test_the_cli_refuses_a_missing_token_file_in_one_line(home, capsys):
    from raysoft.cli import main

    assert main(["run", "jobs/fedsoft_synthetic.yaml", "--token-file", str(home / "nope")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"raysoft: error: --token-file: {str(home / 'nope')!r} is not a file holding a token"]
