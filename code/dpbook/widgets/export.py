"""``python -m dpbook.widgets export DIR``: every animation as a standalone HTML file, plus an
index page in teaching order, in presentation mode by default. The files need no Jupyter and
no network: copy the folder to a USB stick and open ``index.html`` in any browser. Each page
fills one screen (no scrolling at 1920 × 1080) and links back to the index."""

from __future__ import annotations

import argparse
import html
import pathlib
from typing import Callable

from .player import Player

INDEX = "index.html"  # every exported page links back to it


def catalogue() -> list[tuple[str, str, Callable[[bool], Player]]]:
    """(file stem, Vietnamese title, factory(presentation)) in the order the chapter teaches."""
    from . import ddp_buckets, dp_vs_ddp, fsdp, ledger, ring

    return [
        ("dp-vs-ddp", "DataParallel và DDP: một vòng lặp huấn luyện",
         lambda p: dp_vs_ddp.player(4, presentation=p)),
        ("ring-allreduce-4", "Ring AllReduce với 4 rank", lambda p: ring.player(4, presentation=p)),
        ("ring-allreduce-8", "Ring AllReduce với 8 rank", lambda p: ring.player(8, presentation=p)),
        ("ddp-buckets", "Bucket của DDP và chồng lấp tính toán – giao tiếp",
         lambda p: ddp_buckets.player(0.1, presentation=p)),
        ("ddp-buckets-so-sanh", "Vì sao dùng bucket: so sánh ba cách AllReduce",
         lambda p: ddp_buckets.comparison_player(0.1, presentation=p)),
        # The FSDP lifecycle replays a trace of a real run: these two record one each (~2 s).
        ("fsdp-full-shard", "Vòng đời shard của FSDP: FULL_SHARD",
         lambda p: fsdp.player("FULL_SHARD", presentation=p)),
        ("fsdp-shard-grad-op", "Vòng đời shard của FSDP: SHARD_GRAD_OP",
         lambda p: fsdp.player("SHARD_GRAD_OP", presentation=p)),
        ("so-ke-toan-vram", "Sổ kế toán VRAM: LLaMA-7B theo số GPU",
         lambda p: ledger.player("llama-7b", presentation=p)),
    ]


def export(directory: str | pathlib.Path, presentation: bool = True) -> list[pathlib.Path]:
    """Write the animations and ``index.html`` into ``directory``; return the paths written."""
    out = pathlib.Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written, items = [], []
    for stem, title, factory in catalogue():
        path = out / f"{stem}.html"
        path.write_text(factory(presentation).standalone_html(home=INDEX), encoding="utf-8")
        written.append(path)
        items.append(f'<li><a href="{stem}.html">{html.escape(title)}</a></li>')
    index = out / INDEX
    index.write_text(
        '<!DOCTYPE html><html lang="vi"><head><meta charset="utf-8">'
        "<title>Hình động — Chương 4: Data parallelism</title>"
        "<style>body{font-family:'Liberation Sans',Arial,sans-serif;font-size:1.6em;"
        "margin:5vh 8vw}li{margin:0.6em 0}</style></head><body>"
        "<h1>Hình động cho bài giảng — Chương 4: Data parallelism</h1>"
        "<p>Mở từng hình, bấm vào khung hình rồi dùng ← → để đi từng bước, phím cách để phát, "
        "<b>f</b> để xem toàn màn hình, <b>p</b> để bật/tắt chế độ trình chiếu.</p>"
        f"<ol>{''.join(items)}</ol></body></html>",
        encoding="utf-8",
    )
    return [index, *written]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dpbook.widgets",
                                     description="Xuất các hình động thành file HTML độc lập.")
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="ghi mọi hình động và trang mục lục vào THƯ_MỤC")
    ex.add_argument("directory", metavar="THƯ_MỤC")
    ex.add_argument("--no-presentation", action="store_true",
                    help="dùng cỡ chữ thường thay vì chế độ trình chiếu")
    args = parser.parse_args(argv)
    paths = export(args.directory, presentation=not args.no_presentation)
    print(f"Đã ghi {len(paths)} file vào {pathlib.Path(args.directory).resolve()}; "
          f"mở {paths[0].name} để bắt đầu.")
    return 0
