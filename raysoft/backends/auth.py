"""Ray's token authentication, kept on for every Ray that raysoft starts or joins.

Ray looks for the cluster's token in ``RAY_AUTH_TOKEN``, in the file ``RAY_AUTH_TOKEN_PATH``
names, or in ``~/.ray/auth_token``. Before raysoft starts or joins a Ray it makes sure one is
there: a local Ray gets a new token, written readable by its owner only, when none exists; a
cluster joined by address needs the cluster's own token, and without one the run is refused in
one line saying where to put it (instead of Ray's retries and a traceback). A default token
file that others can read is made private. ``RAY_AUTH_MODE=disabled`` (the user's choice for a
cluster without authentication) turns all of this off.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from ..config import ConfigError
from . import raycompat

MODE, TOKEN, TOKEN_PATH = "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"


def default_token_path() -> Path:
    return Path.home() / ".ray" / "auth_token"


def holds_token(path: Path) -> bool:
    return path.is_file() and bool(path.read_text().strip())


def find_token() -> str | None:
    """Where the token Ray will use comes from (the variable or file), or None."""
    if os.environ.get(TOKEN, "").strip():
        return TOKEN
    named = os.environ.get(TOKEN_PATH)
    if named:
        if not holds_token(Path(named).expanduser()):
            raise ConfigError(f"{TOKEN_PATH}: {named!r} is not a file holding a token")
        return str(Path(named).expanduser())
    return str(default_token_path()) if holds_token(default_token_path()) else None


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable and writable by its owner only (0600) from the start."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)


def make_private(path: Path) -> None:
    """Take group and other permissions off a token file this user owns."""
    st = path.stat()
    if st.st_uid == os.getuid() and st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        os.chmod(path, 0o600)


def use_token_file(path: str) -> None:
    """``--token-file``: the cluster's token is in ``path``."""
    p = Path(path).expanduser()
    if not holds_token(p):
        raise ConfigError(f"--token-file: {path!r} is not a file holding a token")
    os.environ[TOKEN_PATH] = str(p.absolute())


def prepare(address: str | None) -> None:
    """Make token authentication work for the Ray about to be started (``address`` None) or
    joined; enable it for this process and the processes it starts (quietly: Ray warns when it
    turns it on by itself)."""
    mode = os.environ.get(MODE)
    if mode is not None and mode.lower() != "token":
        return  # the user turned it off, for a cluster without authentication
    source = find_token()
    if source is None:
        if address:
            raise ConfigError(f"ray.address: joining {address} needs the cluster's authentication token: set "
                              f"{TOKEN}, point {TOKEN_PATH} (or --token-file) at a copy of the head's "
                              f"~/.ray/auth_token, or put it in {default_token_path()}")
        write_private(default_token_path(), secrets.token_hex(32))
    elif source == str(default_token_path()):
        make_private(default_token_path())
    if mode is None:
        _enable_in_process()


def _enable_in_process() -> None:
    """Token mode for this process and its children: the variable, and Ray's cached config
    refreshed (a Ray imported earlier read the mode when it was imported), as ray.init does."""
    os.environ[MODE] = "token"
    raycompat.enable_token_auth()  # without Ray's private call, the environment variable is what counts
