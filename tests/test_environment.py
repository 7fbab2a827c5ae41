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


def _make_n(root, *args):
    """What ``make -n -B setup ARGS`` would run (``-n``: print, run nothing)."""
    import shutil
    import subprocess

    if shutil.which("make") is None:
        import pytest

        pytest.skip("không có make")
    return subprocess.run(["make", "-n", "-B", "setup", *args], cwd=root, capture_output=True,
                          text=True, timeout=60)


def test_torch_cpu_installs_pytorchs_cpu_build_of_the_pinned_version(root):
    pin = re.search(r"^torch==(\S+)", (root / "constraints.txt").read_text(), re.M).group(1)
    default = _make_n(root)
    assert default.returncode == 0, default.stderr
    assert '-c constraints.txt "torch" ' in default.stdout and "--index-url" not in default.stdout
    cpu = _make_n(root, "TORCH=cpu")
    assert cpu.returncode == 0, cpu.stderr
    assert (f'-c constraints.txt --index-url https://download.pytorch.org/whl/cpu '
            f'"torch=={pin}+cpu"') in cpu.stdout
    assert ".dpbook-installed-cpu" in cpu.stdout  # its own stamp: switching builds reinstalls
    # the package goes in under the same pin, by uv or, where uv cannot be had, by pip
    installs = "-c constraints.txt -e ."
    assert cpu.stdout.count(installs) == default.stdout.count(installs) == 2
    assert cpu.stdout.count("-e .") == default.stdout.count("-e .") == 2
    wrong = _make_n(root, "TORCH=cuda")
    assert wrong.returncode != 0 and "TORCH=cpu" in wrong.stderr
    readme = (root / "README.md").read_text()
    assert "TORCH=cpu" in readme


def test_the_cpu_build_satisfies_the_pin():
    from packaging.specifiers import SpecifierSet

    assert SpecifierSet("==2.13.0").contains("2.13.0+cpu")  # what `-c constraints.txt` checks
    assert not SpecifierSet("==2.13.0+cpu").contains("2.13.0")  # so a CUDA build is replaced
