"""Property test: any config mapping either validates or fails with one clean ConfigError line."""

import os

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from raysoft.api import check_data
from raysoft.config import (
    Config,
    ConfigError,
    DataConfig,
    ModelConfig,
    OutputConfig,
    RayConfig,
    TrainConfig,
    parse_config,
)
from raysoft.plugins import registered, settings_class

SECTIONS = {
    "data": DataConfig, "model": ModelConfig, "train": TrainConfig, "ray": RayConfig, "output": OutputConfig,
}
values = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 300), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8), st.sampled_from(["10:90", "random", "clusters", "fmnist", "fpfc_synthetic", "cnn",
                                          "logistic", "auto", "sgd", "adam", "inprocess", "fedem", "ifca"]),
    st.lists(st.integers(0, 360), max_size=4), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def section(model) -> st.SearchStrategy:
    keys = list(model.model_fields) + ["bogus"]
    return st.dictionaries(st.sampled_from(keys), values, max_size=4)


ALGORITHM_CONFIGS = {name: settings_class("algorithms", name) for name in registered("algorithms")}
algorithm = st.builds(
    lambda name, rest: {"name": name, **rest},
    st.sampled_from([*ALGORITHM_CONFIGS, "nope"]),
    st.dictionaries(st.sampled_from(sorted({k for c in ALGORITHM_CONFIGS.values() for k in c.model_fields} | {"x"})),
                    values, max_size=4),
)
configs = st.fixed_dictionaries(
    {}, optional={"seed": values, "algorithm": st.one_of(algorithm, values), **{k: st.one_of(section(m), values)
                                                                                  for k, m in SECTIONS.items()},
                  "faults": st.one_of(values, st.lists(st.dictionaries(st.sampled_from(["kind", "at_round", "client"]),
                                                                       values, max_size=3), max_size=2))},
)


@pytest.mark.slow
@settings(
    max_examples=int(os.environ.get("RAYSOFT_FUZZ_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(configs)
@example({"algorithm": {"name": [], "a": None}})  # an unhashable name once raised TypeError
def test_random_configs_validate_or_fail_cleanly(raw):
    try:
        cfg = parse_config(raw)
        check_data(cfg)
    except ConfigError as err:
        msg = str(err)
        assert msg and "\n" not in msg
    else:
        assert isinstance(cfg, Config)
