"""Stress the launcher: many 2-rank gloo launches in concurrent streams (processes, like
pytest-xdist workers), counting failures. It must print 0.

    .venv/bin/python benchmarks/launch_stress.py                # 200 launches, 2 streams
"""

import argparse
import statistics
import subprocess
import sys
import time


def stream(launches: int) -> None:
    """One stream: ``launches`` launches back to back; prints failures and durations."""
    from dpbook import launch, workers

    failures, times = [], []
    for i in range(launches):
        fn = workers.say_hello if i % 2 else workers.all_reduce_rank_ids  # leave at once / not
        t0 = time.perf_counter()
        try:
            launch.spawn(fn, world_size=2, backend="gloo", output="none", timeout=120)
        except Exception as exc:  # noqa: BLE001 - counted, not raised
            failures.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        times.append(time.perf_counter() - t0)
    print(f"RESULT {len(failures)} {statistics.median(times[1:]):.4f} {max(times[1:]):.3f}")
    for f in failures:
        print("FAIL", f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=200, help="in all, over every stream")
    parser.add_argument("--streams", type=int, default=2)
    parser.add_argument("--stream", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stream is not None:
        return stream(args.stream)
    per = args.launches // args.streams
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, __file__, "--stream", str(per)],
                              stdout=subprocess.PIPE, text=True) for _ in range(args.streams)]
    outs = [p.communicate()[0] for p in procs]
    failed, medians, slowest = 0, [], 0.0
    for out in outs:
        for line in out.splitlines():
            if line.startswith("RESULT"):
                _, n, med, top = line.split()
                failed += int(n)
                medians.append(float(med))
                slowest = max(slowest, float(top))
            elif line.startswith("FAIL"):
                print(line)
    total = per * args.streams
    print(f"{total} lần khởi động 2 rank từ {args.streams} process song song: {failed} thất bại; "
          f"trung vị mỗi lần {statistics.median(medians):.3f} s, chậm nhất {slowest:.2f} s; tổng {time.perf_counter() - t0:.0f} s")
    sys.exit(1 if failed or any(p.returncode for p in procs) else 0)


if __name__ == "__main__":
    main()
