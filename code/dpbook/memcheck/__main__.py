"""``python -m dpbook.memcheck MODULE:FUNCTION --strategy ...``: see ``dpbook.memcheck``."""

from __future__ import annotations

import argparse
import json
import sys

from . import STRATEGIES, MemcheckError, plot, run, table


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own complaints, in the command's voice
        self.print_usage(sys.stderr)
        self.exit(2, f"memcheck: lỗi: {message}\n")


def main(argv=None) -> int:
    parser = _Parser(prog="python -m dpbook.memcheck",
                     description="Sổ kế toán VRAM so với bộ nhớ mô hình của bạn thật sự cấp phát.")
    parser.add_argument("spec", metavar="MODULE:FUNCTION",
                        help="hàm trả về (model, batch) hoặc (model, batch, loss_fn); MODULE là "
                             "tên module hoặc đường dẫn file .py")
    parser.add_argument("--strategy", default="ddp",
                        help="một trong: " + ", ".join(STRATEGIES))
    parser.add_argument("--wrap", default="auto",
                        help="FSDP2: auto (một đơn vị mỗi khối theo kích thước), root (cả mô "
                             "hình một đơn vị) hoặc mẫu tên module con (ví dụ 'blocks.*')")
    parser.add_argument("--nproc", type=int, default=2, help="số rank (mặc định 2)")
    parser.add_argument("--steps", type=int, default=3, help="số bước Adam (mặc định 3)")
    parser.add_argument("--json", metavar="FILE", help="ghi báo cáo JSON vào FILE")
    parser.add_argument("--plot", metavar="FILE", help="vẽ biểu đồ cột vào FILE (png, svg)")
    args = parser.parse_args(argv)
    try:
        report = run(args.spec, args.strategy, args.wrap, args.nproc, args.steps)
    except (MemcheckError, ValueError) as e:
        print(f"memcheck: lỗi: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - a rank failed: its message, no traceback wall
        print(f"memcheck: lần chạy thất bại: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(table(report))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report.as_json(), f, ensure_ascii=False, indent=1)
    if args.plot:
        plot(report, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
