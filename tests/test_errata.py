"""Errata III (issue 27) cannot come back: one pattern per wrong statement (W item) of the four
expert reads in ``../shared/reviews/audit-*.md``, searched in every page's prose (markdown cells
and .md pages, NFC, whitespace folded). Each pattern is the wrong claim's own wording, loose
enough to catch it reworded a little; the correct statements are asserted by runs on the pages."""

import re
import unicodedata

import pytest

import book_sources

# (report and item, what was wrong, pattern of the wrong statement)
WRONG = [
    ("4.1.1-4.1.4 W1", "init_process_group chờ đủ N process (chỉ khi TORCH_DIST_INIT_BARRIER=1)",
     r"init_process_group[^.]{0,80}chỉ trả về khi đủ"),
    ("4.1.5-4.1.8 W1", "FSDP2 chỉ thêm (N−1)/N của đơn vị đang tính: nó cấp cả đơn vị",
     r"gom tham số đầy đủ của đơn vị đang tính[^.]{0,60}tức thêm"),
    ("4.1.5-4.1.8 W2", "SHARD_GRAD_OP: 2P + 16P/N vì shard tham số fp32 (vì gradient fp32)",
     r"shard tham số fp32.{0,80}bên cạnh tham số đầy đủ bf16"),
    ("4.2.1-4.2.6 W1", "launch.spawn mở TCPStore trên cổng 0 (nó dùng FileStore)",
     r"launch\.spawn`? (làm theo cách này|làm đúng như vậy)[^.]{0,80}TCPStore"),
    ("4.2.1-4.2.6 W2", "env:// không nhận rank/world size qua đối số",
     r"env://`? không nhận rank"),
    ("4.2.1-4.2.6 W3", "gloo không có ReduceOp.AVG",
     r"gloo không có (phép )?`?(ReduceOp\.)?AVG"),
    ("4.2.1-4.2.6 W4", "checkpoint có bốn mục (có năm: thêm scaler)",
     r"checkpoint có bốn mục"),
    ("4.2.1-4.2.6 W5", "init_from_env nằm trong dpbook.scripts.torchrun_env",
     r"init_from_env[^.]{0,40}nằm trong `?dpbook\.scripts\.torchrun_env"),
    ("4.2.1-4.2.6 W6", "TORCHELASTIC_RESTART_COUNT tăng 1 mỗi lần nhóm khởi động lại (đếm theo agent)",
     r"TORCHELASTIC_RESTART_COUNT`?[^.]{0,40}(tăng thêm 1|tăng dần|đếm số lần nhóm worker)"),
    ("4.2.7 W1", "gom trước tường minh giải phóng ngay sau khi chép (nó giữ bộ đệm AllGather)",
     r"gom trước tường minh[^.]{0,40}giải phóng ngay"),
    ("4.2.7 W2", "lượt ngược chạy lại một khối qua hook của FSDP2 (_pre_forward không chạy)",
     r"Hook của FSDP2 biết chuyện này"),
    ("4.2.7 W3", "Bài B: với cả FSDP1 lẫn FSDP2 rank giữ khối cuối một lần",
     r"với cả FSDP1 lẫn FSDP2[^.]{0,120}một lần"),
    ("4.1.1-4.1.4 M1", "DDP giữ 16P (mặc định là 20P với bản sao trong bucket)",
     r"DDP (mặc định )?(chỉ )?giữ \$?16P\$?(?![^.]{0,80}(trạng thái|bucket|cộng|\+))"),
]


def _prose(root):
    for path in book_sources.pages():
        texts = ([path.read_text(encoding="utf-8")] if path.suffix == ".md" else
                 [c.source for c in book_sources.cells(path, "markdown")])
        for i, text in enumerate(texts):
            yield f"{path.relative_to(root)} #{i}", " ".join(
                unicodedata.normalize("NFC", text).split())


def test_the_patterns_catch_the_quotes_of_the_reports():
    quotes = {
        "4.1.1-4.1.4 W1": "`torch.distributed.init_process_group` nhận bốn thông tin đó và chỉ trả "
                          "về khi đủ $N$ process đã tham gia.",
        "4.2.1-4.2.6 W2": "Lưu ý dạng `env://` không nhận rank hay world size qua đối số",
        "4.2.1-4.2.6 W3": "gloo không có phép `AVG` nên ta cộng rồi chia.",
        "4.2.1-4.2.6 W4": "Checkpoint có bốn mục: `model`, `optimizer`, `epoch`, `config`.",
        "4.2.1-4.2.6 W6": "với biến môi trường `TORCHELASTIC_RESTART_COUNT` tăng thêm 1.",
        "4.2.7 W1": "gom trước tường minh và lượt ngược giải phóng ngay sau khi chép.",
        "4.1.5-4.1.8 W2": "FSDP2 giữ shard tham số fp32 (`FSDPParam._sharded_param_data`, …) bên "
                          "cạnh tham số đầy đủ bf16, nên con số thật là $2P + 16P/N$",
        "4.1.1-4.1.4 M1": "Với Adam, DDP giữ $16P$ byte mỗi GPU.",
    }
    for item, quote in quotes.items():
        pattern = next(p for i, _, p in WRONG if i == item)
        assert re.search(pattern, quote, re.I), item


@pytest.mark.parametrize("item, what, pattern", WRONG, ids=[w[0] for w in WRONG])
def test_no_page_repeats_a_corrected_statement(root, item, what, pattern):
    found = [where for where, text in _prose(root) if re.search(pattern, text, re.I)]
    assert not found, f"{item} ({what}) xuất hiện lại ở: {found}"
