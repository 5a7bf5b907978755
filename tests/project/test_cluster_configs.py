"""The shipped cluster configs: each parses, passes the schema it is written for (the cluster
launcher's schema of the installed Ray; KubeRay's v1 CRD schemas, kept in tests/support/kuberay),
pins the Ray raysoft is tested with, and does what it says: rsync filters that leave the .venv
behind, a cluster token made once (0600) on the head and handed to the workers, GPU drivers on
GPU nodes, results on a volume that outlives the pods.

Pure file checks and small shell runs: nothing here starts Ray or touches a network."""

import copy
import gzip
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from importlib.metadata import version

import pytest
import yaml
from support.paths import KUBERAY_CRDS, ROOT

CC = ROOT / "cluster_configs"
LAUNCHER = ["aws.yaml", "gcp.yaml"]
KUBERAY = ["kuberay-raycluster.yaml", "kuberay-rayjob.yaml"]
RAY = version("ray")
TORCH = version("torch").split("+")[0]
TORCHVISION = version("torchvision").split("+")[0]
PY = f"{sys.version_info.major}.{sys.version_info.minor}"
IMAGE_HOME = "/home/ray/raysoft/"  # the Dockerfile's WORKDIR: the repository's jobs/ are there
# KubeRay's v1 CRD schemas, extracted and kept in the repository (tests/support/kuberay/README.md)
CRD_DIR = KUBERAY_CRDS


def launcher(name):
    return yaml.safe_load((CC / name).read_text())


def kuberay(name):
    """The documents of a KubeRay manifest file, by kind."""
    docs = [d for d in yaml.safe_load_all((CC / name).read_text()) if d]
    by_kind = {d["kind"]: d for d in docs}
    assert len(by_kind) == len(docs), name
    return by_kind


def commands(c, key):
    return "\n".join(c.get(key, []))


# --- the cluster launcher (ray up) ------------------------------------------------------------


@pytest.mark.parametrize("name", LAUNCHER)
def test_cluster_launcher_yaml(name):
    c = launcher(name)
    for key in ("cluster_name", "max_workers", "provider", "auth", "available_node_types", "head_node_type"):
        assert key in c, key
    assert c["head_node_type"] in c["available_node_types"]
    assert c["auth"]["ssh_user"]
    for node in c["available_node_types"].values():
        assert {"node_config", "min_workers", "max_workers", "resources"} <= node.keys()
    p = c["provider"]
    assert "region" in p
    if p["type"] == "gcp":
        assert {"availability_zone", "project_id"} <= p.keys()
    text = (CC / name).read_text()
    assert "0.0.0.0" not in text and "RAY_AUTH_MODE=token" in text


@pytest.mark.parametrize("name", LAUNCHER)
def test_cluster_launcher_passes_rays_schema(name):
    """What `ray up` checks first: the schema of the installed Ray, after filling in the
    provider's defaults as `ray up` does."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    c = launcher(name)
    validate_config(copy.deepcopy(c))
    validate_config(prepare_config(copy.deepcopy(c)))


@pytest.mark.parametrize("name", LAUNCHER)
def test_cluster_launcher_autoscaling_bounds(name):
    c = launcher(name)
    head = c["head_node_type"]
    workers = {k: v for k, v in c["available_node_types"].items() if k != head}
    assert workers
    assert c["available_node_types"][head]["max_workers"] == 0
    for node in workers.values():
        assert 0 <= node["min_workers"] <= node["max_workers"] <= c["max_workers"]
    assert sum(n["min_workers"] for n in workers.values()) <= c["max_workers"]


@pytest.mark.parametrize("name", LAUNCHER)
def test_cluster_launcher_installs_the_tested_versions(name):
    """The nodes get the Ray (and torch) of the .venv raysoft is tested with, in a virtualenv of
    the same Python, and raysoft from the synced tree -- not `ray[default]>=...`."""
    c = launcher(name)
    setup = commands(c, "setup_commands")
    assert re.findall(r"ray\[default\]==([\w.]+)", setup) == [RAY]
    assert ">=" not in setup
    assert re.findall(r"\btorch==([\w.]+)", setup) == [TORCH]
    assert re.findall(r"torchvision==([\w.]+)", setup) == [TORCHVISION]
    assert f"--python {PY} " in setup
    assert "~/raysoft" in setup and c["file_mounts"]["~/raysoft"] == "."
    assert "raysoft-venv/bin" in setup  # on PATH for the launcher's later commands
    assert "~/raysoft-venv" in commands(c, "head_setup_commands")  # the provider's client library goes there


@pytest.mark.parametrize("name", LAUNCHER)
def test_cluster_launcher_rsync_filters(name, tmp_path):
    """The filters, given to rsync exactly as the launcher gives them, leave out .venv, runs/,
    .git and caches, and keep the sources."""
    c = launcher(name)
    assert {".venv", "/runs", ".git", "__pycache__"} <= set(c["rsync_exclude"])
    assert ".gitignore" in c["rsync_filter"]
    rsync = shutil.which("rsync")
    if rsync is None:
        pytest.skip("rsync is not installed")
    args = [a for p in c["rsync_exclude"] for a in ("--exclude", p)]
    args += [a for f in c["rsync_filter"] for a in ("--filter", f"dir-merge,- {f}")]

    def synced(src):
        out = subprocess.run([rsync, "-a", "--dry-run", "--out-format=%n", *args, f"{src}/", str(tmp_path / "dst")],
                             capture_output=True, text=True, check=True).stdout
        return [line.rstrip("/") for line in out.splitlines() if line.strip()]

    tree = tmp_path / "tree"
    for f in [".venv/bin/python", ".venv-flower/x", "runs/r1/metrics.parquet", ".git/HEAD",
              "raysoft/__pycache__/a.cpython-311.pyc", ".pytest_cache/v", ".hypothesis/h",
              "raysoft.egg-info/PKG-INFO", "raysoft/a.py", "jobs/x.yaml", "pyproject.toml", "docs/runs.md"]:
        (tree / f).parent.mkdir(parents=True, exist_ok=True)
        (tree / f).write_text("x")
    shutil.copy(ROOT / ".gitignore", tree / ".gitignore")
    got = set(synced(tree))
    assert {"raysoft/a.py", "jobs/x.yaml", "pyproject.toml", "docs/runs.md"} <= got
    leaked = [p for p in got if p.split("/")[0] in {".venv", ".venv-flower", "runs", ".git", ".pytest_cache",
                                                     ".hypothesis", "raysoft.egg-info"} or "__pycache__" in p]
    assert not leaked
    real = synced(ROOT)  # this checkout: its sources, no .venv
    assert "pyproject.toml" in real and "raysoft/cli.py" in real and "jobs/fedsoft_synthetic.yaml" in real
    assert not [p for p in real if p.split("/")[0] in {".venv", "runs", ".git"}]


def _bash(cmd, home, check=True):
    env = {"HOME": str(home), "PATH": os.environ["PATH"]}
    return subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, text=True, check=check)


@pytest.mark.parametrize("name", LAUNCHER)
def test_cluster_token_made_once_on_the_head_and_given_to_the_workers(name, tmp_path):
    """The head's setup makes ~/.ray/auth_token (0600, Ray's token format) once; the autoscaler
    copies it to the workers (cluster_synced_files), whose setup refuses to go on without it."""
    c = launcher(name)
    assert c["cluster_synced_files"] == ["~/.ray/auth_token"]
    token_cmds = [cmd for cmd in c["head_setup_commands"] if "~/.ray" in cmd]
    assert token_cmds and not any("get-auth-token" in cmd for cmd in token_cmds)  # that one writes 0644
    home = tmp_path / "head"
    home.mkdir()
    for cmd in token_cmds:
        _bash(cmd, home)
    token = home / ".ray" / "auth_token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert stat.S_IMODE(token.parent.stat().st_mode) == 0o700
    first = token.read_text()
    assert re.fullmatch(r"[0-9a-f]{64}", first)
    for cmd in token_cmds:  # a second `ray up` keeps the cluster's token
        _bash(cmd, home)
    assert token.read_text() == first and not (home / ".ray" / "auth_token.new").exists()

    check = next(cmd for cmd in c["worker_setup_commands"] if "auth_token" in cmd)
    bare = tmp_path / "worker"
    bare.mkdir()
    assert _bash(check, bare, check=False).returncode != 0
    (bare / ".ray").mkdir()
    shutil.copy(token, bare / ".ray" / "auth_token")
    assert _bash(check, bare, check=False).returncode == 0
    # every Ray process runs with token authentication, the dashboard on the head's 127.0.0.1
    head_start = commands(c, "head_start_ray_commands")
    assert "RAY_AUTH_MODE=token ray start --head" in head_start and "--dashboard-host=127.0.0.1" in head_start
    assert "RAY_AUTH_MODE=token ray start --address" in commands(c, "worker_start_ray_commands")


def test_gpu_workers_get_drivers():
    aws = launcher("aws.yaml")
    for node in aws["available_node_types"].values():  # a Deep Learning AMI with the NVIDIA driver
        assert "deeplearning" in node["node_config"]["ImageId"] and "nvidia-driver" in node["node_config"]["ImageId"]
    gcp = launcher("gcp.yaml")
    gpu_types = [n for n in gcp["available_node_types"].values() if n["node_config"].get("guestAccelerators")]
    assert gpu_types
    for node in gpu_types:
        items = {i["key"]: i["value"] for i in node["node_config"]["metadata"]["items"]}
        assert items["install-nvidia-driver"] == "True"
        assert node["resources"]["GPU"] >= 1
    for c in (aws, gcp):
        assert "nvidia-smi" in commands(c, "worker_setup_commands")


# --- KubeRay ----------------------------------------------------------------------------------


def _containers(pod_template):
    return pod_template["spec"]["containers"]


def _cluster_specs():
    rc = kuberay("kuberay-raycluster.yaml")["RayCluster"]
    job = kuberay("kuberay-rayjob.yaml")["RayJob"]
    return {"RayCluster": rc["spec"], "RayJob": job["spec"]["rayClusterSpec"]}


def test_kuberay_manifests():
    rc = kuberay("kuberay-raycluster.yaml")["RayCluster"]
    assert rc["apiVersion"] == "ray.io/v1"
    job = kuberay("kuberay-rayjob.yaml")["RayJob"]
    assert job["apiVersion"] == "ray.io/v1"
    for spec in _cluster_specs().values():
        assert spec["authOptions"] == {"mode": "token"}
        assert spec["rayVersion"] == RAY
        # KubeRay's dashboard on 0.0.0.0 (pod network) is what its submitter and Service use
        assert "dashboard-host" not in spec["headGroupSpec"]["rayStartParams"]
        assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
        for group in spec["workerGroupSpecs"]:
            assert group["groupName"]
            assert 0 <= group["minReplicas"] <= group.get("replicas", group["minReplicas"]) <= group["maxReplicas"]
    assert job["spec"]["shutdownAfterJobFinishes"] is True


def test_kuberay_images_are_the_dockerfiles_at_the_tested_ray():
    for spec in _cluster_specs().values():
        templates = [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]
        for t in templates:
            for c in _containers(t):
                image = c["image"]
                assert "ray-ml" not in image  # no longer published for recent Ray
                assert image.split(":")[0].endswith("/raysoft") and f":ray{RAY}-" in image, image
                gpu = "nvidia.com/gpu" in c["resources"].get("limits", {})
                assert image.endswith("-cpu") != gpu, image  # CUDA torch where there is a GPU


def test_kuberay_results_go_to_a_persistent_volume():
    for name in KUBERAY:
        docs = kuberay(name)
        claim = docs["PersistentVolumeClaim"]
        assert claim["apiVersion"] == "v1" and claim["spec"]["resources"]["requests"]["storage"]
        kind = "RayCluster" if "RayCluster" in docs else "RayJob"
        spec = docs[kind]["spec"] if kind == "RayCluster" else docs[kind]["spec"]["rayClusterSpec"]
        head = spec["headGroupSpec"]["template"]["spec"]
        volumes = {v["name"]: v for v in head["volumes"]}
        assert not any("emptyDir" in v or "hostPath" in v for v in volumes.values())
        (mount,) = [m for c in head["containers"] for m in c.get("volumeMounts", [])]
        assert volumes[mount["name"]]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
        assert head["securityContext"]["fsGroup"] == 100  # the image's user may write there
        text = (CC / name).read_text()
        assert f"--out {mount['mountPath']}/" in text


def test_kuberay_rayjob_installs_raysoft_from_the_image():
    job = kuberay("kuberay-rayjob.yaml")["RayJob"]
    env = yaml.safe_load(job["spec"]["runtimeEnvYAML"])
    assert not any(p.strip().startswith("-e") for p in env.get("pip", []))  # pip runs where there is no project
    assert env["env_vars"]["OMP_NUM_THREADS"] == "1"
    entry = job["spec"]["entrypoint"].split()
    assert entry[:2] == ["raysoft", "run"] and entry[2].startswith(IMAGE_HOME)
    assert (ROOT / entry[2][len(IMAGE_HOME):]).is_file()


def _crd_schema(kind):
    """The openAPIV3Schema of KubeRay's v1 CRD of ``kind``."""
    return json.loads(gzip.decompress((CRD_DIR / f"{kind.lower()}-v1.schema.json.gz").read_bytes()))


def _strict(schema):
    """The CRD schema, with unknown fields rejected where Kubernetes' strict field validation
    (kubectl's default) rejects them: objects that list their properties and do not keep unknown
    fields."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if ("properties" in schema and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@pytest.mark.parametrize("name,kind", [("kuberay-raycluster.yaml", "RayCluster"), ("kuberay-rayjob.yaml", "RayJob")])
def test_kuberay_manifest_validates_against_the_crd(name, kind):
    import jsonschema  # a dependency of ray
    schema = _strict(_crd_schema(kind))
    doc = kuberay(name)[kind]
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, "; ".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors[:10])
    # the check would catch a misspelt field
    bad = copy.deepcopy(doc)
    spec = bad["spec"] if kind == "RayCluster" else bad["spec"]["rayClusterSpec"]
    spec["headGroupSpec"]["rayStartParam"] = {}
    assert list(jsonschema.Draft7Validator(schema).iter_errors(bad))


# --- the image, the local script, the headers -------------------------------------------------


def test_dockerfile_installs_raysoft_at_the_tested_versions():
    text = (ROOT / "Dockerfile").read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
    assert args["RAY_VERSION"] == RAY and args["TORCH_VERSION"] == TORCH and args["TORCHVISION_VERSION"] == TORCHVISION
    assert args["CUDA"] == "cpu" and "download.pytorch.org/whl/${CUDA}" in text
    (base,) = re.findall(r"^FROM (\S+)", text, re.M)
    assert base == "rayproject/ray:${RAY_VERSION}-py" + PY.replace(".", "") + "-cpu"
    assert '"ray[default]==${RAY_VERSION}" /tmp/raysoft' in text and " -e " not in text
    for src in re.findall(r"^COPY (?:--\S+ )*(.+) \S+$", text, re.M):
        for path in src.split():
            assert (ROOT / path).exists(), path
    assert f"WORKDIR {IMAGE_HOME.rstrip('/')}" in text and "COPY --chown=1000:100 jobs ./jobs" in text
    ignore = [ln for ln in (ROOT / ".dockerignore").read_text().splitlines() if ln and not ln.startswith("#")]
    assert ignore[0] == "*"  # nothing but what is admitted: no .venv, runs/, .git
    admitted = {ln[1:].rstrip("/") for ln in ignore if ln.startswith("!")}
    assert admitted == {"pyproject.toml", "README.md", "raysoft", "jobs"}


def test_runtime_env_and_local_script():
    env = yaml.safe_load((ROOT / "jobs" / "runtime_env.yaml").read_text())
    assert env["env_vars"]["OMP_NUM_THREADS"] == "1" and "pip" not in env
    script = (CC / "local.sh").read_text()
    assert "--dashboard-host=127.0.0.1" in script and "0.0.0.0" not in script
    assert "pkill" not in script and "killall" not in script and "ray stop" not in script
    assert "setsid" in script
    subprocess.run(["bash", "-n", str(CC / "local.sh")], check=True)


@pytest.mark.parametrize("name", [*LAUNCHER, *KUBERAY, "local.sh", "../Dockerfile"])
def test_each_config_says_what_was_checked(name):
    head = []
    for line in (CC / name).read_text().splitlines():
        if line.startswith("#"):
            head.append(line)
        elif line.strip():
            break
    head = "\n".join(head)
    assert "Checked here" in head and "Not checked here" in head, name
