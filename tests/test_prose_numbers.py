"""What the orientation pages (.md, no code cells) state, checked against the package and the
other pages: the formulas and ratios they name, the one list of DataParallel's weaknesses, the one
notation table, the reading path and the table of contents. The openers orient: the tests also
hold them to linking a topic's home instead of deriving it again (the editor's review, §3.5)."""

import json
import re
import unicodedata

import pytest
import yaml

from dpbook import costs, memory
from dpbook.pages import dataparallel

CH04 = ("book", "ch04")


def _read(root, *parts):
    return (root.joinpath(*parts)).read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def chapter(root):
    return _read(root, *CH04, "index.md")


@pytest.fixture(scope="module")
def p1(root):
    return _read(root, *CH04, "p1", "index.md")


@pytest.fixture(scope="module")
def p2(root):
    return _read(root, *CH04, "p2", "index.md")


@pytest.fixture(scope="module")
def path_page(root):
    return _read(root, *CH04, "lo-trinh.md")


@pytest.fixture(scope="module")
def intro(root):
    return _read(root, "book", "intro.md")


def _flat(text):
    return " ".join(text.split())


def test_chapter_page_starts_with_the_four_objectives(chapter):
    box = chapter[chapter.index("```{admonition} Mục tiêu học"):chapter.index("## Vì sao phải tiến hóa")]
    assert len(re.findall(r"^\d\. ", box, flags=re.M)) == 4
    for objective in ("DP → DDP → FSDP", "`DistributedSampler`", "`auto_wrap_policy`",
                      "lượng giao tiếp mỗi bước của DDP và FSDP"):
        assert objective in _flat(box), objective


def test_chapter_formulas_and_ratio(chapter):
    """FULL_SHARD sends 3(N-1)/N Psi a GPU a step, DDP 2(N-1)/N Psi: 50% more for the same dtype."""
    for n in (2, 8, 64):
        ddp = costs.ddp_step_bytes(1.0, n).total
        fsdp = costs.fsdp_step_bytes(1.0, n, "FULL_SHARD").total
        assert ddp == pytest.approx(2 * (n - 1) / n) and fsdp == pytest.approx(3 * (n - 1) / n)
        assert fsdp / ddp - 1 == pytest.approx(0.50)
    assert "2\\frac{N-1}{N}\\Psi" in chapter and "3\\frac{N-1}{N}\\Psi" in chapter
    assert "nhiều hơn DDP 50% khi cùng kiểu dữ liệu" in chapter


def test_ddp_memory_row_names_the_bucket_copy(chapter):
    """DDP's default (gradient_as_bucket_view=False) keeps a second copy of the gradients in its
    buckets; the comparison table says so (audit 4.1.1-4.1.4, M1)."""
    P, N = 10**6, 8
    default = memory.vram_ledger(P, N, "DDP")
    view = memory.vram_ledger(P, N, "DDP", bucket_view=True)
    assert default.buffers == 4 * P and view.buffers == 0 and default.state == view.state == 16 * P
    assert "thêm một bản sao gradient trong các bucket" in chapter


def test_chapter_decision_rule_is_the_three_line_rule(chapter):
    rule = chapter[chapter.index("Quy tắc quyết định"):chapter.index("## Bài thực hành")]
    lines = re.findall(r"^\d\. .*$", rule, flags=re.M)
    assert len(lines) == 3
    assert "**DDP**" in lines[0] and "**FSDP**" in lines[1] and "`HYBRID_SHARD`" in lines[2]
    assert "](p1/08-chon-ddp-hay-fsdp.ipynb)" in rule
    assert "$" not in rule.split("Quy tắc quyết định")[1] and "GB" not in rule


def test_one_list_of_dataparallel_weaknesses(root, chapter, p1):
    """4.1.2 defines DataParallel's weaknesses; the openers name the two heaviest in its words
    and link there."""
    words = dataparallel.WEAKNESSES
    assert len(words) == 6
    section = root.joinpath(*CH04, "p1", "02-dataparallel.ipynb")
    cells = json.loads(section.read_text(encoding="utf-8"))["cells"]
    page = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    for w in words:
        assert w.lower() in _flat(page).lower(), w
    for text, link in ((chapter, "p1/02-dataparallel.ipynb"), (p1, "02-dataparallel.ipynb")):
        flat = _flat(text)
        assert "sáu nhược điểm" in flat and f"]({link})" in text
        assert words[0] in flat and words[3] in flat
        assert "lỗi chí mạng" not in flat.lower() and "đề cương" not in flat.lower()
        assert "ba điểm yếu" not in flat and "ba giới hạn" not in flat


def test_notation_table_has_every_symbol_of_the_chapter(p1):
    table = p1[p1.index("Đọc thêm: bảng ký hiệu đầy đủ"):]
    for symbol in ("$N$", "$P$", "$\\Psi$", "$S$", "$R$", "$K$", "$n$", "$G$"):
        assert f"\n{symbol}\n: " in table, symbol
    assert "số **byte**" in table and "$n_{1/2}$" in table and "$R = N/S$" in table
    assert "$K = 8$" in table and "$K = 12$" in table
    assert sum(memory.bytes_per_param("fp32")[2:]) == 8 and sum(memory.bytes_per_param("mixed")[2:]) == 12
    # the five symbols every page uses are shown; the table itself is collapsed
    shown = p1[p1.index("## Cách đọc các công thức"):p1.index("Đọc thêm: bảng ký hiệu đầy đủ")]
    assert all(s in shown for s in ("$N$", "$P$", "$\\Psi$", "$B$", "$S$", "$R$"))


def test_openers_link_each_topic_to_its_home(chapter, p1, p2, intro):
    """One home per derivation or caveat (editor's review §3.5): the sampler's padding lives in
    4.1.3, the FSDP mixed-precision bytes in 4.1.6/4.1.8, HSDP's traffic in Lab C, the book's
    launcher and the Kaggle steps on the environment page, the DDP checklist in 4.2.2."""
    for text in (chapter, p1, p2):
        assert "drop_last" not in text and "đệm thêm vài chỉ số" not in text
        assert "distributed.py" not in text
    assert "bf16" not in chapter and "reduce_dtype" not in chapter
    assert "2\\frac{R-1}{R}" not in chapter and "\\frac{\\Psi}{S}" not in chapter
    for text in (p2, intro):
        assert "forkserver" not in text and "FileStore" not in text
    assert "cloudpickle" not in intro and "GPU T4 x2" not in intro
    assert "](02-ddp-day-du.ipynb)" in p2 and "../moi-truong.ipynb" in p2
    assert "ch04/moi-truong.ipynb" in intro


def test_environment_page_is_home_of_kaggle_and_the_launcher(root):
    cells = json.loads(_read(root, *CH04, "moi-truong.ipynb"))["cells"]
    prose = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    kaggle = prose[prose.index("Đọc thêm: chạy chương trên Kaggle"):]
    assert "GPU T4 x2" in kaggle and "dpbook.doctor" in kaggle
    launcher = prose[prose.index("Đọc thêm: bộ khởi động của sách"):]
    for word in ("forkserver", "FileStore", "TORCH_DIST_INIT_BARRIER", "cloudpickle"):
        assert word in launcher, word
    from dpbook import launch
    assert launch.INIT_BARRIER == {"TORCH_DIST_INIT_BARRIER": "1"}
    assert launch.context().get_start_method() in ("forkserver", "spawn")
    import inspect
    assert "dist.FileStore(" in inspect.getsource(launch)


def _toc_files(node):
    if isinstance(node, dict):
        if "file" in node:
            yield node["file"]
        for v in node.values():
            yield from _toc_files(v)
    elif isinstance(node, list):
        for v in node:
            yield from _toc_files(v)


def test_reading_path_and_table_of_contents(root, chapter, intro, path_page):
    assert "](lo-trinh.md)" in chapter and "](ch04/lo-trinh.md)" in intro
    # every page the path names exists
    here = root.joinpath(*CH04)
    links = re.findall(r"\]\(([^)#]+\.(?:ipynb|md))\)", path_page)
    assert len(links) > 20
    for link in links:
        assert (here / link).resolve().exists(), link
    for heading in ("## Hai buổi tối", "## Một tuần", "## Cho giảng viên"):
        assert heading in path_page
    # each animation page appears in the lecturer's plan
    plan = path_page[path_page.index("## Cho giảng viên"):]
    for widget in ("dp-vs-ddp", "ring-allreduce", "ddp-buckets", "fsdp-lifecycle", "ledger"):
        assert f"../widgets/{widget}.ipynb" in plan, widget
    toc = yaml.safe_load(_read(root, "_toc.yml"))
    chapter_entry = toc["parts"][0]["chapters"][0]
    assert chapter_entry["file"] == "book/ch04/index"
    assert chapter_entry["sections"][0]["file"] == "book/ch04/lo-trinh"
    parts = {p["caption"]: list(_toc_files(p)) for p in toc["parts"]}
    extension = {f"book/ch04/p2/{f}" for f in ("06-chiu-loi", "07-ddp-nang-cao", "07-fsdp-nang-cao",
                                                "bai-d-tu-viet-ddp",
                                                "bai-e-tu-viet-fsdp")}
    assert set(parts["Phần mở rộng"]) == extension
    assert not extension & set(list(_toc_files(toc["parts"][0])))
    # the seed's three labs stay in part 4.2 (Bài B is off the two-evening path only)
    assert {f"book/ch04/p2/bai-{x}" for x in ("a-ddp", "b-ddp-vs-fsdp", "c-sharding-strategy")} \
        <= set(_toc_files(toc["parts"][0]))
    widgets = next(c for c in parts if "book/widgets/index" in parts[c])
    assert "giảng viên" in widgets


@pytest.mark.parametrize("page", ["index.md", "lo-trinh.md", "p1/index.md", "p2/index.md",
                                  "../intro.md", "../glossary.md", "../widgets/index.md"])
def test_orientation_pages_follow_the_terminology(root, page):
    text = root.joinpath(*CH04, page).read_text(encoding="utf-8")
    assert unicodedata.is_normalized("NFC", text)
    for banned in ("ngây thơ", "dưới DDP", "dưới từng", "mỗi vòng lặp", "tham số dòng lệnh",
                   "tải lại", "tải checkpoint", "Các tham số của {term}`torchrun`",
                   "Các tham số từ khóa", "thanh tiến trình", "đỉnh bộ nhớ", "tensor song song"):
        assert banned not in text, banned
