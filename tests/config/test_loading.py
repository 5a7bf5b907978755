"""Config validation: every bad input is a one-line error that names the key."""

import subprocess
import sys

import pytest
import yaml
from support.configs import small_config
from support.paths import JOBS

from raysoft.config import ConfigError, apply_overrides, load_config, load_raw, load_yaml, parse_config


def test_defaults_resolve_and_round_trip():
    cfg = parse_config({})
    d = cfg.to_dict()
    assert d["algorithm"]["name"] == "fedsoft"
    assert d["algorithm"]["num_centers"] == 2  # defaults to data.distributions
    assert d["algorithm"]["estimation_interval"] == 2 and d["algorithm"]["sigma"] == 1e-4
    assert d["train"] == {"optimizer": "adam", "lr": 0.005, "batch_size": 10, "local_epochs": 10,
                          "shuffle": False, "momentum": 0.0, "weight_decay": 0.0, "nan_policy": "stop",
                          "batched_clients": "auto", "gpu_rows": 8, "device": "auto"}
    assert parse_config(d) == cfg


BAD = [
    ({"algorithm": {"name": "fedsoft", "foo": 1}}, "algorithm.foo: unknown key"),
    ({"algorithm": {"name": "nope"}}, "algorithm.name: unknown algorithm 'nope'"),
    ({"algorithm": {"rounds": "ten"}}, "algorithm.rounds: Input should be a valid integer"),
    ({"algorithm": {"rounds": 0}}, "algorithm.rounds: Input should be greater than or equal to 1"),
    ({"algorithm": {"sigma": -0.1}}, "algorithm.sigma"),
    ({"algorithm": {"clients_per_round": 200}}, "algorithm.clients_per_round (200) > data.clients (100)"),
    ({"data": {"partition": "50:50"}}, "data.partition"),
    ({"data": {"partition": 1090}}, "data.partition: got the number 1090; quote it"),
    ({"data": {"distributions": 3}}, "partition '10:90' needs distributions: 2"),
    ({"data": {"samples_min": 300}}, "samples_min (300) > samples_max (200)"),
    ({"data": {"clients": 0}}, "data.clients"),
    ({"data": {"name": "mnist"}}, "data.name"),
    ({"train": {"lr": 0}}, "train.lr: Input should be greater than 0"),
    ({"train": {"optimizer": "rmsprop"}}, "train.optimizer"),
    ({"train": {"device": "gpu"}}, "train.device: Input should be 'auto', 'cpu' or 'cuda'"),
    ({"train": {"batch_size": 2.5}}, "train.batch_size: Input should be a valid integer"),
    ({"ray": {"clients_per_actor": 0}}, "ray.clients_per_actor"),
    ({"ray": {"clients_per_actor": "many"}}, "ray.clients_per_actor"),
    ({"ray": {"num_gpus_per_actor": -1}}, "ray.num_gpus_per_actor"),
    ({"ray": {"backend": "dask"}}, "ray.backend"),
    ({"output": {"progress": "loud"}}, "output.progress"),
    ({"output": {"name": "../../x"}}, "output.name: must be one file name, not a path (got '../../x')"),
    ({"output": {"name": "/tmp/x"}}, "output.name: must be one file name, not a path"),
    ({"output": {"name": "a/b"}}, "output.name: must be one file name, not a path (got 'a/b')"),
    ({"output": {"name": "a\\b"}}, "output.name: must be one file name, not a path"),
    ({"output": {"name": ".."}}, "output.name: must name a folder inside output.dir"),
    ({"output": {"name": ".hidden"}}, "output.name: must not start with '.'"),
    ({"ray": {"placement_timeout_s": 0}}, "ray.placement_timeout_s: Input should be greater than 0"),
    ({"bogus": {}}, "bogus: unknown key"),
    ({"seed": "x"}, "seed: Input should be a valid integer"),
    ({"data": [1, 2]}, "data: must be a mapping"),
]


@pytest.mark.parametrize("raw,expected", BAD, ids=[b[1][:40] for b in BAD])
def test_bad_configs_name_the_key(raw, expected):
    with pytest.raises(ConfigError) as err:
        parse_config(raw)
    msg = str(err.value)
    assert expected in msg
    assert "\n" not in msg


def test_overrides_parse_yaml_values(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(small_config()))
    cfg = load_config(path, ["algorithm.rounds=7", "train.shuffle=true", "data.partition=linear", "seed=9"])
    assert cfg.algorithm.rounds == 7 and cfg.train.shuffle is True
    assert cfg.data.partition == "linear" and cfg.seed == 9


@pytest.mark.parametrize(
    "override,expected",
    [("algorithm.rounds", "expected section.key=value"), ("nosuch.key=1", "nosuch: unknown section"),
     ("train.lr=[", "cannot parse value"), ("train.lr.x=1", "train.lr: Input should be a valid number"),
     ("train..lr=1", "expected section.key=value")],
)
def test_bad_overrides(override, expected):
    with pytest.raises(ConfigError, match=expected.replace("[", r"\[")):
        load_config(None, [override])


def test_overrides_reach_any_depth_and_read_exponents_as_numbers():
    raw = load_raw(None, ["regimes.fedsoft.train.lr=1e-3", "regimes.fedsoft.train.optimizer=adam", "train.lr=2E-2",
                          "data.root='1e-3'", "seed=3"])
    assert raw["regimes"] == {"fedsoft": {"train": {"lr": 0.001, "optimizer": "adam"}}}
    assert raw["train"]["lr"] == 0.02 and raw["data"]["root"] == "1e-3" and raw["seed"] == 3
    given = {"train": {"lr": 0.5}}
    assert load_raw(None, []) == {} and apply_overrides(given, ["train.lr=0.1"])["train"]["lr"] == 0.1
    assert given == {"train": {"lr": 0.5}}  # the caller's mapping is not changed
    with pytest.raises(ConfigError, match=r"^seed: must be a mapping to set seed\.x$"):
        apply_overrides({"seed": 1}, ["seed.x=1"])


def test_a_job_file_reads_exponents_as_numbers_as_set_does(tmp_path):
    # YAML 1.1 reads 5e-3 as the string '5e-3': the file was refused while --set train.lr=5e-3 worked
    path = tmp_path / "c.yaml"
    path.write_text("train: {lr: 5e-3, weight_decay: 1E-4}\nalgorithm: {sigma: -1.5e+0, rounds: 3}\n"
                    "data: {root: '1e-3'}\n")
    raw = load_raw(path)
    assert raw["train"] == {"lr": 0.005, "weight_decay": 0.0001} and raw["algorithm"]["sigma"] == -1.5
    assert raw["data"]["root"] == "1e-3"  # quoted: still a string
    path.write_text("train: {lr: 5e-3}\n")
    assert load_config(path).train.lr == 0.005 == load_config(None, ["train.lr=5e-3"]).train.lr


def test_a_sweep_file_reads_exponents_as_numbers(tmp_path):
    from raysoft.sweep import load_spec

    (tmp_path / "base.yaml").write_text("train: {lr: 1e-2}\n")
    (tmp_path / "s.yaml").write_text("config: base.yaml\ngrid: {train.lr: [1e-3, 5e-3]}\n")
    spec, base = load_spec(tmp_path / "s.yaml")
    assert spec.grid == {"train.lr": [0.001, 0.005]} and base["train"]["lr"] == 0.01


@pytest.mark.parametrize("given,expected", [
    ({"algorithm": {"prox_wieght": 1}}, "algorithm.prox_wieght: unknown key (did you mean `prox_weight`?)"),
    ({"train": {"bacth_size": 1}}, "train.bacth_size: unknown key (did you mean `batch_size`?)"),
    ({"ray": {"backnd": "ray"}}, "ray.backnd: unknown key (did you mean `backend`?)"),
    ({"callbacks": [{"name": "tensorboard", "logdr": "x"}]}, "callbacks.0.logdr: unknown key (did you mean `logdir`?)"),
    ({"faults": [{"kind": "kill_actor", "at_round": 1, "actor": 0, "actr": 1}]},
     "faults.0.actr: unknown key (did you mean `actor`?)"),
    ({"clok": {}}, "clok: unknown key (did you mean `clock`?)"),
    ({"train": {"zzz": 1}}, "train.zzz: unknown key"),
])
def test_an_unknown_key_names_the_nearest_known_key(given, expected):
    with pytest.raises(ConfigError) as err:
        parse_config(given)
    assert str(err.value) == expected
    with pytest.raises(ConfigError, match=r"^clok: unknown section \(did you mean `clock`\?\) \(known: seed"):
        load_raw(None, ["clok.speeds=equal"])


def test_a_section_that_allows_extra_keys_keeps_them():
    from pydantic import ConfigDict

    from raysoft.config import Section

    class Open(Section):
        model_config = ConfigDict(extra="allow")
        mode: str = "a"

    assert Open.model_validate({"mode": "b", "other": 1}).model_extra == {"other": 1}


@pytest.mark.parametrize("text,expected", [("off", "off"), ("on", "on"), ("auto", "auto"), ("no", "off"),
                                           ("yes", "on")])
def test_yaml_booleans_are_the_words_of_a_choice(tmp_path, text, expected):
    # YAML 1.1 reads off/on/no/yes as booleans: train.batched_clients=off was refused (got False)
    assert load_config(None, [f"train.batched_clients={text}"]).train.batched_clients == expected
    path = tmp_path / "c.yaml"
    path.write_text(f"train: {{batched_clients: {text}}}\nclock: {{speeds: off}}\n")
    cfg = load_config(path)
    assert cfg.train.batched_clients == expected and cfg.clock.speeds == "off"
    assert load_config(None, ["train.shuffle=on"]).train.shuffle is True  # a boolean key keeps its boolean
    with pytest.raises(ConfigError, match=r"^clock\.speeds: Input should be 'off', 'equal', 'lognormal' or 'file' "
                                          r"\(got 'on'\)$"):
        load_config(None, ["clock.speeds=on"])  # no "on" among its words: the word the user wrote


def test_the_boolean_words_are_words_for_any_string_key_and_booleans_for_a_boolean_key(tmp_path):
    # the YAML reader keeps on/off/yes/no (any case) as words, as YAML 1.2 does; a key that
    # takes a boolean takes them as one, a choice of words as the word of the same meaning
    assert load_yaml("a: off\nb: Yes\nc: true\nd: FALSE") == {"a": "off", "b": "Yes", "c": True, "d": False}
    cfg = load_config(None, ["train.shuffle=yes", "train.batched_clients=OFF", "output.name=no", "ray.trim_memory=Off"])
    assert cfg.train.shuffle is True and cfg.train.batched_clients == "off" and cfg.output.name == "no"
    assert cfg.ray.trim_memory is False
    assert parse_config({"train": {"batched_clients": False, "shuffle": "no"}}).train.batched_clients == "off"
    path = tmp_path / "c.yaml"
    path.write_text("train: {shuffle: no, batched_clients: on}\n")
    assert (load_config(path).train.shuffle, load_config(path).train.batched_clients) == (False, "on")


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("algorithm: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML at line"):
        load_config(bad)
    bad.write_text("- just a list\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(bad)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "raysoft", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "args,expected",
    [
        (["--set", "algorithm.rounds=-1"], "algorithm.rounds: Input should be greater than or equal to 1"),
        (["--set", "train.nope=1"], "train.nope: unknown key"),
        (["--bogus-flag"], "unrecognized arguments: --bogus-flag"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, args, expected):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(small_config()))
    out = tmp_path / "out"
    proc = _cli("run", str(cfg), "--out", str(out), *args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0]
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("name", ["../../x", "ABSOLUTE", "a/b"])
def test_cli_output_name_is_one_component_nothing_written_anywhere(tmp_path, name):
    # today's main wrote ../../x outside --out, and computed a/b's whole run before failing
    base = tmp_path / "one" / "two"
    base.mkdir(parents=True)
    if name == "ABSOLUTE":
        name = str(tmp_path / "abs")
    cfg = base / "c.yaml"
    cfg.write_text(yaml.safe_dump(small_config()))
    proc = _cli("run", str(cfg), "--out", str(base / "out"), "--set", f"output.name={name}")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("raysoft: error: output.name: must be one file name, not a path")
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == ["one", "one/two",
                                                                                    "one/two/c.yaml"]


def test_a_run_directory_name_is_one_component(tmp_path):
    import raysoft

    with pytest.raises(ConfigError, match="dir_name: must be one file name, not a path"):
        raysoft.run(small_config(), out=tmp_path, dir_name="../x")
    assert list(tmp_path.iterdir()) == []


def test_cli_unwritable_output_is_a_config_error(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(small_config()))
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = _cli("run", str(cfg), "--out", str(blocker / "sub"))
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("raysoft: error: output.dir: cannot create")


JOB_FILES = sorted(JOBS.glob("*.yaml"))


@pytest.mark.parametrize("path", [p for p in JOB_FILES if p.name != "runtime_env.yaml"], ids=lambda p: p.name)
def test_every_shipped_job_validates(path):
    from raysoft.compare import algorithm_configs
    from raysoft.config import COMPARE_DEFAULT

    if path.name.startswith("compare_"):
        assert len(algorithm_configs(load_raw(path), list(COMPARE_DEFAULT))) == 5
    elif path.name.startswith("sweep_"):  # a sweep: every trial's config validates
        from raysoft.sweep import load_spec, trial_config, trial_points

        spec, base = load_spec(path)
        assert all(trial_config(base, point, spec.trial.actors) for point in trial_points(spec))
    else:
        load_config(path)


def test_another_algorithms_key_points_to_raysoft_compare():
    with pytest.raises(ConfigError, match=r"^algorithm\.init_threshold: unknown key \(init_threshold is a key of ifca: "
                                          r"a config with several algorithms' keys is for raysoft compare"):
        parse_config({"algorithm": {"name": "fedsoft", "init_threshold": 0.35}})
    with pytest.raises(ConfigError, match=r"^algorithm\.no_such_key: unknown key$"):
        parse_config({"algorithm": {"name": "fedsoft", "no_such_key": 1}})


@pytest.mark.parametrize("data,expected", [
    ({"name": "fpfc_synthetic", "rotations": [0, 90]},
     r"data\.rotations: unknown key \(rotations is a key of the datasets cifar10, cifar100, emnist_letters, fmnist\)$"),
    ({"name": "synthetic", "rotations": [0, 90]}, r"data\.rotations: unknown key \(rotations is a key of the datasets"),
    ({"name": "fmnist", "theta_std": 3.0},
     r"data\.theta_std: unknown key \(theta_std is a key of the datasets synthetic\)$"),
    ({"name": "fmnist", "rotations": [0]}, r"data: rotations has 1 angles but distributions is 2$"),
    ({"name": "emnist_letters", "distributions": 3, "partition": "random"}, "data: emnist_letters has 1, 2 or 4"),
])
def test_each_dataset_checks_its_own_rules(data, expected):
    with pytest.raises(ConfigError, match=f"^{expected}"):
        parse_config({"data": data, "model": {"name": "logistic"}})


def test_each_dataset_has_its_own_defaults_and_null_means_them():
    fpfc = parse_config({"data": {"name": "fpfc_synthetic", "clients": 8, "dim": None}, "model": {"name": "logistic"},
                         "algorithm": {"name": "fpfc", "clients_per_round": 4}}).data
    assert (fpfc.partition, fpfc.dim, fpfc.noise_std) == ("clusters", 60, 0.5)
    plain = parse_config({"data": {"name": "synthetic", "noise_std": None}}).data
    assert (plain.partition, plain.dim, plain.noise_std) == ("10:90", 10, 1.0)


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_a_bad_ccfl_cycles_is_refused_naming_cycles_not_rounds(value):
    # rounds defaults to data.clients x cycles: a bad cycles must not surface as a bad rounds
    with pytest.raises(ConfigError) as err:
        load_config(JOBS / "ccfl_fmnist_k4.yaml", [f"algorithm.cycles={value}"])
    assert str(err.value).startswith("algorithm.cycles: ") and "rounds" not in str(err.value)
