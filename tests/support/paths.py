"""Where the repository's folders are, for the tests that read them."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
JOBS = ROOT / "jobs"  # the job configs
ANALYSIS = ROOT / "analysis"  # the scripts behind the docs' tables
EXAMPLES = ROOT / "examples"
SOURCE = ROOT / "raysoft"
KUBERAY_CRDS = Path(__file__).resolve().parent / "kuberay"  # KubeRay's v1 CRD schemas (its README)
