"""Ray's and Tune's own chatter: off inside quiet_ray, back after it, kept when asked."""

import logging
import os

import pytest

from raysoft import quiet
from raysoft.quiet import quiet_ray


class Catch(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def caught(monkeypatch):
    monkeypatch.delenv(quiet.ASK, raising=False)
    monkeypatch.delenv("RAY_AIR_NEW_OUTPUT", raising=False)
    catch = Catch()
    ray_logger = logging.getLogger("ray")
    ray_logger.addHandler(catch)
    try:
        yield catch
    finally:
        ray_logger.removeHandler(catch)


def _say_everything() -> None:
    from ray._private.runtime_env import packaging
    from ray.dashboard.modules import dashboard_sdk

    packaging.default_logger.info("Pushing file package 'gcs://_ray_pkg_x.zip' (1.0MiB) to Ray cluster...")
    dashboard_sdk.logger.info("Uploading package gcs://_ray_pkg_x.zip.")
    packaging.default_logger.warning("a real warning")
    logging.getLogger("ray.tune.utils.callback").warning("The TensorboardX logger cannot be instantiated because ...")
    logging.getLogger("ray.tune.tune").warning('Resume experiment with: Tuner.restore(path="x", trainable=...)')
    logging.getLogger("ray.tune.tune").warning("another Tune warning")


def test_packaging_info_and_tunes_chatter_are_off_inside_and_back_after(caught):
    # `--address http://` printed 25 of packaging.py's INFO lines, a sweep Tune's TensorboardX warning
    with quiet_ray():
        assert os.environ["RAY_AIR_NEW_OUTPUT"] == "0"  # Tune's experiment table off with verbose=0
        _say_everything()
    assert caught.lines == ["a real warning", "another Tune warning"]
    assert "RAY_AIR_NEW_OUTPUT" not in os.environ
    caught.lines.clear()
    _say_everything()
    assert len(caught.lines) == 6


def test_asked_for_everything_is_kept(caught, monkeypatch):
    monkeypatch.setenv(quiet.ASK, "1")
    with quiet_ray():
        _say_everything()
    assert len(caught.lines) == 6
