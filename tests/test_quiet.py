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


SPEAKERS = ("ray", "ray._private.runtime_env.packaging", "ray.dashboard.modules.dashboard_sdk",
            "ray.tune.utils.callback", "ray.tune.tune")  # the loggers _say_everything uses


@pytest.fixture
def caught(monkeypatch):
    monkeypatch.delenv(quiet.ASK, raising=False)
    monkeypatch.delenv("RAY_AIR_NEW_OUTPUT", raising=False)
    # Ray's loggers as a fresh process has them, whatever an earlier test's ray.init(logging_level=...)
    # left set: "ray" open, the others inheriting from it
    levels = {name: logging.getLogger(name).level for name in SPEAKERS}
    for name in SPEAKERS:
        logging.getLogger(name).setLevel(logging.DEBUG if name == "ray" else logging.NOTSET)
    catch = Catch()
    ray_logger = logging.getLogger("ray")
    ray_logger.addHandler(catch)
    try:
        yield catch
    finally:
        ray_logger.removeHandler(catch)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


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


def test_a_descendant_with_a_level_of_its_own_is_quiet_too(caught):
    logging.getLogger("ray._private.runtime_env.packaging").setLevel(logging.INFO)  # as Ray may set it
    with quiet_ray():
        _say_everything()
    assert caught.lines == ["a real warning", "another Tune warning"]
    assert logging.getLogger("ray._private.runtime_env.packaging").level == logging.INFO  # restored


def test_asked_for_everything_is_kept(caught, monkeypatch):
    monkeypatch.setenv(quiet.ASK, "1")
    with quiet_ray():
        _say_everything()
    assert len(caught.lines) == 6
