# syntax=docker/dockerfile:1
# raysoft on Ray: the image the KubeRay manifests (cluster_configs/kuberay-*.yaml) run, raysoft
# installed (not editable) from this source tree, the experiment configs in /home/ray/raysoft/jobs.
#
#   docker build -t YOUR_REGISTRY/raysoft:ray2.60.0-cpu .                           # CPU-only torch
#   docker build --build-arg CUDA=cu130 -t YOUR_REGISTRY/raysoft:ray2.60.0-cu130 .  # CUDA torch
#   docker push YOUR_REGISTRY/raysoft:ray2.60.0-cpu   (and the -cu130 one for GPU workers)
#
# Checked here: tests/project/test_cluster_configs.py checks that the Ray and torch versions below are the
# ones of the .venv raysoft is tested with, and that .dockerignore keeps the build context to the
# sources. Not checked here: a build or a run (no Docker engine where this was written).
#
# Nothing is downloaded at run time and no data set is baked in: image data sets come from a
# volume (data.root), results go to a volume or a pyarrow.fs URI (--out).

# Ray, exactly the version raysoft is tested with (`.venv/bin/python -c 'import ray;
# print(ray.__version__)'`); the cluster configs pin the same one, and the tests fail when they
# differ. rayproject/ray brings Python 3.11 (the laptop's), the `ray` user (uid 1000, gid 100)
# KubeRay expects, and the tools of KubeRay's probes.
ARG RAY_VERSION=2.60.0
FROM rayproject/ray:${RAY_VERSION}-py311-cpu
ARG RAY_VERSION

# The PyTorch wheel index: cpu (the default: no CUDA libraries, a much smaller image) or a CUDA
# build published for this torch version, e.g. cu130 (what the PyPI wheel in .venv is built for;
# the nodes need an NVIDIA driver >= 580) or cu128 (driver >= 570). CUDA wheels bring their own
# CUDA runtime; GPU nodes bring the driver (NVIDIA device plugin / container toolkit).
ARG CUDA=cpu
ARG TORCH_VERSION=2.14.1
ARG TORCHVISION_VERSION=0.29.1

RUN pip install --no-cache-dir --index-url "https://download.pytorch.org/whl/${CUDA}" \
        "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}"

COPY --chown=1000:100 pyproject.toml README.md /tmp/raysoft/
COPY --chown=1000:100 raysoft /tmp/raysoft/raysoft
# ray pinned again so that resolving raysoft's own requirement (ray[default]>=...) cannot move it
RUN pip install --no-cache-dir "ray[default]==${RAY_VERSION}" /tmp/raysoft \
    && rm -rf /tmp/raysoft \
    && python -c "import ray, torch, raysoft; assert ray.__version__ == '${RAY_VERSION}', ray.__version__; print('ray', ray.__version__, 'torch', torch.__version__)"

WORKDIR /home/ray/raysoft
COPY --chown=1000:100 jobs ./jobs
