"""environment.yml (conda) and pyproject.toml list the same dependencies."""

import re
import tomllib

import yaml


def _norm(req: str) -> str:
    return re.sub(r"\s+", "", req).lower().replace("_", "-")


def test_conda_environment_matches_pyproject(root):
    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    env = yaml.safe_load((root / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    conda_reqs = sorted(_norm(r) for r in pip if not r.startswith("-e"))
    assert conda_reqs == sorted(_norm(d) for d in deps)
    assert "-e ." in pip  # the package itself


def test_torch_pin_is_within_the_declared_range(root):
    pin = (root / "constraints.txt").read_text()
    assert re.search(r"^torch==2\.(\d+)\.", pin, re.M)
    assert int(re.search(r"^torch==2\.(\d+)\.", pin, re.M).group(1)) >= 6


def test_ci_runs_the_readme_test_command(root):
    readme = (root / "README.md").read_text()
    assert "make book" in readme and "make test" in readme
    assert "make test" in (root / ".ci" / "run").read_text()
