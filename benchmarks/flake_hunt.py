"""The flake hunt: every notebook and every test file that starts processes, run several times
under the load of ``make test`` (2 xdist workers, ``--dist loadfile``), with a table per file of
how many runs failed and which tests (notebook cells) failed. A benchmark, not part of
``make test``: five runs take about half an hour on the 2-core reference machine.

    .venv/bin/python benchmarks/flake_hunt.py [--runs 5] [--jobs 2] [PATH ...]

Without PATH: every notebook under book/ and tests/runtime, tests/labs, tests/tools. The runs do
not write the book's execution cache (the cache plugin is left out). Exit status 1 if any run
failed, so that the hunt can gate a change.
"""

import argparse
import collections
import pathlib
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROCESS_TESTS = ("tests/runtime", "tests/labs", "tests/tools")


def default_targets() -> list[str]:
    notebooks = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "book").rglob("*.ipynb")
                       if ".ipynb_checkpoints" not in p.parts and "_build" not in p.parts)
    return notebooks + list(PROCESS_TESTS)


def run_once(targets: list[str], jobs: int, report: pathlib.Path) -> tuple[int, float]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-n", str(jobs), "--dist", "loadfile",
           "--nbval-lax", "-m", "not builds_book", "-p", "no:cacheprovider",
           # the pyproject's options without the execution-cache plugin
           "-o", "addopts=-ra --strict-markers", "-o", "junit_family=xunit1",
           f"--junitxml={report}", *targets]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    return proc.returncode, time.perf_counter() - t0


def failures(report: pathlib.Path) -> dict[str, list[str]]:
    """File -> names of the tests (notebook cells) that failed or errored in one run."""
    out = collections.defaultdict(list)
    for case in ET.parse(report).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            where = case.get("file") or case.get("classname", "?").replace(".", "/")
            out[where].append(case.get("name", "?"))
    return dict(out)


def files_run(report: pathlib.Path) -> collections.Counter:
    seen = collections.Counter()
    for case in ET.parse(report).getroot().iter("testcase"):
        seen[case.get("file") or case.get("classname", "?").replace(".", "/")] += 1
    return seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="số lần chạy (mặc định 5)")
    parser.add_argument("--jobs", type=int, default=2, help="số worker xdist (mặc định 2)")
    parser.add_argument("paths", nargs="*", help="notebook hay thư mục kiểm thử (mặc định: tất cả)")
    args = parser.parse_args()
    if args.runs < 1 or args.jobs < 1:
        parser.error(f"--runs và --jobs phải >= 1, nhận được {args.runs}, {args.jobs}")
    targets = args.paths or default_targets()
    failed_runs = collections.Counter()
    cells = collections.defaultdict(collections.Counter)
    seen = collections.Counter()
    with tempfile.TemporaryDirectory(prefix="flake-hunt-") as tmp:
        for i in range(args.runs):
            report = pathlib.Path(tmp, f"run{i}.xml")
            rc, seconds = run_once(targets, args.jobs, report)
            if not report.exists():
                print(f"lần {i + 1}: pytest không ghi báo cáo (mã thoát {rc})")
                return 1
            seen.update(files_run(report).keys())
            fails = failures(report)
            for where, names in fails.items():
                failed_runs[where] += 1
                cells[where].update(names)
            print(f"lần {i + 1}/{args.runs}: {seconds:.0f} s, mã thoát {rc}, "
                  f"{sum(len(v) for v in fails.values())} kiểm thử hỏng", flush=True)
    width = max(len(f) for f in seen) if seen else 10
    print(f"\n{'tệp':<{width}}  hỏng/lần chạy  kiểm thử (ô) hỏng")
    for where in sorted(seen):
        detail = ", ".join(f"{name} ×{n}" for name, n in cells[where].most_common()) or "-"
        print(f"{where:<{width}}  {failed_runs[where]}/{args.runs:<12}  {detail}")
    total = sum(failed_runs.values())
    print(f"\nTổng: {total} lần hỏng trên {len(seen)} tệp × {args.runs} lần chạy")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
