"""Joining a cluster within a deadline: every address form is probed before Ray is asked.

``ray.init`` on an address where no cluster answers retries for minutes and prints a stream of
the Ray core's warnings; the Jobs client raises a traceback. Before either runs, the driver
opens a TCP connection to the address's host and port (the GCS for ``host:port`` and ``auto``,
the Ray Client server for ``ray://``, the dashboard for ``http(s)://`` Jobs), retrying until
``ray.join_timeout_s``, then checks that what accepted it speaks the protocol (a gRPC handshake,
an HTTP answer) in the time left, and refuses with one line (:class:`~raysoft.errors.JoinError`,
exit 2) if not. No Ray import: a socket, grpc and urllib.
"""

from __future__ import annotations

import os
import socket
import time
from urllib.parse import urlsplit

from ..errors import JoinError
from . import raycompat

DEFAULT_PORTS = {"ray": 10001, "http": 80, "https": 443, "": 6379}
WHAT = {"ray": "the Ray Client server", "http": "the Jobs API (dashboard)", "https": "the Jobs API (dashboard)",
        "": "the head's GCS"}


def endpoint(address: str, source: str = "ray.address") -> tuple[str, str, int]:
    """(scheme, host, port) of a Ray address: ``host:port``, ``ray://host:port`` or
    ``http(s)://host:port`` (``auto`` must be resolved first: :func:`resolve_auto`)."""
    text = address.strip()
    scheme = ""
    if "://" in text:
        scheme = text.split("://", 1)[0].lower()
        if scheme not in DEFAULT_PORTS or not scheme:
            raise JoinError(f"{source} {address!r}: unknown scheme {scheme!r} (use host:port, ray:// or http://)")
        parts = urlsplit(text)
    else:
        parts = urlsplit("//" + text)
    try:
        port = parts.port
    except ValueError:
        raise JoinError(f"{source} {address!r}: the port is not a number from 0 to 65535") from None
    if not parts.hostname:
        raise JoinError(f"{source} {address!r}: no host (use host:port, ray://host:port or http://host:port)")
    return scheme, parts.hostname, port if port is not None else DEFAULT_PORTS[scheme]


def resolve_auto() -> str | None:
    """The GCS address ``auto`` stands for (RAY_ADDRESS, else the latest cluster started on this
    machine, as Ray finds it), or None if there is none."""
    env = os.environ.get("RAY_ADDRESS")
    if env and env != "auto":
        return env
    return raycompat.bootstrap_address()  # None without Ray's private lookup: ray.init looks itself


def probe(address: str, timeout_s: float, source: str = "ray.address") -> None:
    """Return once ``address``'s endpoint accepts a TCP connection and answers its protocol;
    :class:`JoinError` (one line naming the address, where it came from (``source``) and what
    did not answer) if not within ``timeout_s``."""
    given = address
    if address.strip() == "auto":
        found = resolve_auto()
        if found is None:
            raise JoinError(f"{source} auto: no Ray cluster was started on this machine and RAY_ADDRESS is unset "
                            "(start one with `ray start --head`, or give its host:port)")
        address = found
    scheme, host, port = endpoint(address, source)
    deadline = time.monotonic() + timeout_s
    why: str | None = "no answer"
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(min(left, 5.0), 0.1)):
                why = None
                break
        except OSError as err:
            why = "no answer" if isinstance(err, TimeoutError) else (err.strerror or type(err).__name__).lower()
        if deadline - time.monotonic() <= 0:
            break
        time.sleep(min(0.5, max(deadline - time.monotonic(), 0.0)))
    shown = given if given == address else f"{given} ({address})"
    if why is None:  # something accepts connections: does it speak the protocol?
        if speaks(scheme, host, port, max(deadline - time.monotonic(), 1.0)):
            return
        why = "something accepts connections there but does not speak its protocol"
    raise JoinError(f"{source} {shown}: {WHAT[scheme]} at {host}:{port} did not answer within {timeout_s:g} s "
                    f"({why}); is the cluster up? (ray.join_timeout_s sets the wait)")


def speaks(scheme: str, host: str, port: int, timeout_s: float) -> bool:
    """Whether the server at host:port answers its protocol within ``timeout_s``: gRPC (the GCS,
    the Ray Client server) completes an HTTP/2 handshake; the Jobs API answers an HTTP request
    (any status: a 401 of a cluster with token authentication is an answer)."""
    if scheme in ("http", "https"):
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(f"{scheme}://{host}:{port}/api/version", timeout=timeout_s):
                return True
        except urllib.error.HTTPError:
            return True
        except (OSError, ValueError):
            return False
    import grpc

    channel = grpc.insecure_channel(f"{host}:{port}")
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout_s)
        return True
    except grpc.FutureTimeoutError:
        return False
    finally:
        channel.close()
