"""Numbers and lists that .md pages (no code cells) state, recomputed with the package and looked
up in the page, so that the prose and the formulas cannot drift apart."""

import inspect
import json
import unicodedata

import pytest
import torch

from dpbook import costs, memory
from dpbook.pages import dataparallel

GB = 1e9


@pytest.fixture(scope="module")
def p1(root):
    return (root / "book" / "ch04" / "p1" / "index.md").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def chapter(root):
    return (root / "book" / "ch04" / "index.md").read_text(encoding="utf-8")


def test_worked_example_of_part_4_1(p1):
    P, N = 10**9, 8
    psi = 4 * P
    assert psi / GB == 4 and "= 4$ GB" in p1
    ddp = costs.ddp_step_bytes(psi, N).total / GB
    fsdp = costs.fsdp_step_bytes(psi, N, "FULL_SHARD").total / GB
    assert (ddp, fsdp, fsdp / ddp) == (7, 10.5, 1.5)
    assert "\\Psi = 7$ GB" in p1 and "\\Psi = 10{,}5$ GB" in p1 and "1,5 lần DDP" in p1
    ddp_state = memory.vram_ledger(P, N, "DDP").state / GB
    fsdp_state = memory.vram_ledger(P, N, "FULL_SHARD").state / GB
    assert (ddp_state, fsdp_state) == (16, 2)
    assert "$16P = 16$ GB" in p1 and "$16P/N = 2$ GB" in p1
    # 7B parameters: 112 GB per GPU with DDP, 14 GB with FULL_SHARD on 8 GPUs
    assert memory.vram_ledger(7 * P, N, "DDP").state / GB == 112
    assert memory.vram_ledger(7 * P, N, "FULL_SHARD").state / GB == 14
    assert "112 GB mỗi GPU" in p1 and "14 GB mỗi GPU" in p1
    # 16 bytes per parameter in both conventions, 2 + 2 + 12 in ZeRO's mixed precision
    assert sum(memory.bytes_per_param("fp32")) == sum(memory.bytes_per_param("mixed")) == 16
    assert "$2 + 2 + 12$" in p1


def test_mixed_precision_note_keeps_ddp_traffic_at_fp32(p1):
    """Under autocast, parameters and .grad stay fp32, so DDP all-reduces 4 bytes a parameter
    (7 GB in the example); only 16-bit gradients on the wire halve it (3.5 GB)."""
    P, N = 10**9, 8
    model = torch.nn.Linear(8, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(torch.randn(2, 8))
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert {p.dtype for p in model.parameters()} == {p.grad.dtype for p in model.parameters()} \
        == {torch.float32}
    assert costs.ddp_step_bytes(4 * P, N).total / GB == 7 and "vẫn 7 GB mỗi GPU mỗi bước" in p1
    assert costs.ddp_step_bytes(2 * P, N).total / GB == 3.5 and "3,5 GB" in p1
    # the three ways the page names to send 16-bit gradients exist in this torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    assert callable(default_hooks.bf16_compress_hook) and "bf16_compress_hook" in p1
    signature = inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__)
    assert signature.parameters["mixed_precision"].default is None and "`mixed_precision`" in p1
    assert "gradient gửi ở 16 bit" not in p1 and "khiến $\\Psi$ còn 2 GB" not in p1


def test_notation_table_has_every_symbol_of_the_chapter(p1):
    table = p1[p1.index("## Cách đọc các công thức"):p1.index("```{admonition} Mục tiêu học")]
    for symbol in ("$N$", "$P$", "$\\Psi$", "$S$", "$R$", "$K$", "$n$", "$G$"):
        assert f"\n{symbol}\n: " in table, symbol
    assert "số **byte**" in table and "$n_{1/2}$" in table and "$R = N/S$" in table
    assert "$K = 8$" in table and "$K = 12$" in table
    assert sum(memory.bytes_per_param("fp32")[2:]) == 8 and sum(memory.bytes_per_param("mixed")[2:]) == 12


def test_one_list_of_dataparallel_weaknesses(root, p1, chapter):
    """4.1.2 defines DataParallel's weaknesses; both openers name the same six, in its words."""
    words = dataparallel.WEAKNESSES
    assert len(words) == 6
    section = root / "book" / "ch04" / "p1" / "02-dataparallel.ipynb"
    cells = json.loads(section.read_text(encoding="utf-8"))["cells"]
    page = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    headings = [line[len("### k. "):] for line in page.split("\n")
                if line.startswith("### ") and line[4:5].isdigit()]
    first_lower = lambda t: t[0].lower() + t[1:]  # noqa: E731
    assert [first_lower(h) for h in headings] == [first_lower(w) for w in words]
    assert "## Sáu nhược điểm" in page
    for text in (page, p1, chapter):
        flat = " ".join(text.split())
        assert "sáu nhược điểm" in flat.lower()
        for w in words:
            assert w in flat, w
    for text in (p1, chapter):
        assert "ba điểm nghẽn" not in text and "ba điểm yếu" not in text
    # "lỗi chí mạng" only inside the quoted outline
    for text in (page, p1, chapter):
        for k in range(text.lower().count("lỗi chí mạng")):
            assert '“Lỗi chí mạng: giới hạn Python GIL' in text


def test_chapter_intro_formulas(chapter):
    for n in (2, 8, 64):
        assert costs.fsdp_step_bytes(1.0, n).total / costs.ddp_step_bytes(1.0, n).total == pytest.approx(1.5)
    assert "2\\frac{N-1}{N}\\Psi" in chapter and "3\\frac{N-1}{N}\\Psi" in chapter
    assert "1,5 lần DDP khi hai bên trao đổi cùng kiểu dữ liệu" in chapter
    assert "nhiều hơn DDP 50%" in chapter
    # bf16 parameters gathered twice, gradients reduced in fp32: as many bytes as fp32 DDP
    P, n = 10**6, 8
    mixed = 2 * costs.ring_bytes("all_gather", 2 * P, n) + costs.ring_bytes("reduce_scatter", 4 * P, n)
    assert mixed == pytest.approx(costs.ddp_step_bytes(4 * P, n).total)
    assert "tham số bf16 mà gradient rút gọn ở fp32 thì bằng DDP fp32" in chapter
    assert "của đơn vị đang tính và của đơn vị gốc" in chapter
    # HYBRID_SHARD in the strategy table: 3(S-1)/S Psi inside a node, 2(R-1)/R Psi/S across
    for nodes, per_node in ((2, 8), (4, 4)):
        n, psi = nodes * per_node, 1.0
        v = costs.fsdp_step_bytes(psi, n, "HYBRID_SHARD", shard_size=per_node)
        inside = v.all_gather_forward + v.all_gather_backward + v.reduce_scatter
        assert inside == pytest.approx(3 * (per_node - 1) / per_node * psi)
        assert v.all_reduce == pytest.approx(2 * (nodes - 1) / nodes * psi / per_node)
    assert "3\\frac{S-1}{S}\\Psi" in chapter and "2\\frac{R-1}{R}\\cdot\\frac{\\Psi}{S}" in chapter
    assert memory.vram_ledger(10**9, 8, "DDP").state == 16 * 10**9 and "$16P$ byte" in chapter
    assert memory.vram_ledger(10**9, 8, "FULL_SHARD").state == 16 * 10**9 / 8 and "$16P/N$" in chapter


def test_chapter_decision_rule_orients_with_the_ladder_of_4_1_8(chapter):
    rule = chapter[chapter.index("Quy tắc quyết định"):chapter.index("### Bài thực hành")]
    rungs = ["DDP", "ZeroRedundancyOptimizer", "SHARD_GRAD_OP", "FULL_SHARD",
             "activation checkpointing", "CPU offload", "HYBRID_SHARD"]
    positions = [rule.index(r) for r in rungs]
    assert positions == sorted(positions)
    assert "](p1/08-chon-ddp-hay-fsdp.ipynb)" in rule and "chia mảnh trong một node vừa" in rule
    assert "$" not in rule and "GB" not in rule  # no numbers derived here


@pytest.mark.parametrize("page", ["index.md", "p1/index.md", "p2/index.md"])
def test_openers_follow_the_terminology(root, page):
    text = (root / "book" / "ch04" / page).read_text(encoding="utf-8")
    assert unicodedata.is_normalized("NFC", text)
    for banned in ("ngây thơ", "dưới DDP", "dưới từng", "mỗi vòng lặp", "tham số dòng lệnh",
                   "tải lại", "tải checkpoint", "Các tham số của {term}`torchrun`",
                   "Các tham số từ khóa"):
        assert banned not in text, banned
