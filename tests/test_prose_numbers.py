"""What the orientation pages (.md, no code cells) state, checked against the package and the
other pages: the formulas and ratios they name, the one list of DataParallel's weaknesses, the one
notation table, the reading path and the table of contents. The openers orient: the tests also
hold them to linking a topic's home instead of deriving it again (the editor's review, §3.5)."""

import re
import unicodedata

import pytest
import yaml

from dpbook import costs, memory
from dpbook.pages import dataparallel
from dpbook.tools import reading

import book_sources

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
    page = book_sources.markdown(section)
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
    prose = book_sources.markdown(root.joinpath(*CH04, "moi-truong.ipynb"))
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


# The two-evening path of lo-trinh.md, section by section: for each page, the titles (a heading's
# start) of the level-2 sections the table names; None: the whole page. Each page's opening (the
# text before its first section, "Bạn sẽ học gì", "Cần biết trước") is read too.
EVENINGS = {
    "Buổi 1": {
        "index.md": ["Vì sao phải tiến hóa"],
        "moi-truong.ipynb": None,
        "p1/01-nen-tang-toan-hoc.ipynb": ["Ý tưởng", "Nhìn bằng hình", "Đo trên một lần chạy thật",
                                          "Batch toàn cục", "Tóm tắt"],
        "p1/02-dataparallel.ipynb": ["Ý tưởng", "Cơ chế", "Hình động", "Sáu nhược điểm",
                                     "Vị trí của DP", "Tóm tắt"],
        "p1/03-ddp.ipynb": ["Ý tưởng", "Broadcast ban đầu", "Cả vòng đời trong một hình",
                            "`DistributedSampler` và `set_epoch()`", "AllReduce gradient",
                            "Những điểm cần nhớ", "Từng bước một", "Hạn chế", "Tóm tắt"],
        "p1/04-bucket-overlap.ipynb": ["Ý tưởng", "Ba cách đồng bộ", "Xem từng khung hình",
                                       "Tích lũy gradient và `no_sync()`", "Tóm tắt"],
        "p1/05-ring-allreduce.ipynb": ["Ý tưởng", "Cơ chế", "Suy ra lượng giao tiếp", "Tóm tắt"],
        "p1/06-fsdp.ipynb": ["Ý tưởng", "Vòng đời một bước FSDP", "Các chiến lược phân mảnh",
                             "Giao tiếp", "FSDP2", "Tóm tắt"],
        "p1/07-so-ke-toan-vram.ipynb": ["Ý tưởng", "16 byte mỗi tham số", "Tóm tắt"],
        "p1/08-chon-ddp-hay-fsdp.ipynb": ["Bảng so sánh", "Quy tắc quyết định", "Tóm tắt"],
    },
    "Buổi 2": {
        "p2/index.md": ["Bộ khung của một hàm worker DDP"],
        "p2/01-giao-tiep.ipynb": ["Ý tưởng", "Các phép toán tập thể, chạy thật"],
        "p2/02-ddp-day-du.ipynb": ["Script", "Bảy thay đổi", "Chạy bằng torchrun",
                                   "DDP có thực sự bằng một process?"],
        "p2/bai-a-ddp.ipynb": None,
        "p2/03-fsdp-day-du.ipynb": ["Script", "Năm quyết định", "Đơn vị bọc", "Độ chính xác hỗn hợp",
                                    "Lưu bằng DCP"],
        "p2/bai-boc-fsdp.ipynb": None,
        "p2/bai-c-sharding-strategy.ipynb": ["Đề bài", "Mã đo và chạy", "Giải thích từng kết quả"],
        "p2/04-torchrun.ipynb": ["Mỗi node một agent", "Trên cụm thật: script SLURM"],
        "p2/05-loi-thuong-gap.ipynb": ["Bảng tra nhanh"],
    },
}
OPENING = ("", "Bạn sẽ học gì", "Cần biết trước")


def _sections(text):
    """{level-2 heading (its text; "" for the opening): its lines}, headings inside fenced blocks
    (code, admonitions) left alone."""
    sections, title, fence = {"": []}, "", None
    for line in text.splitlines():
        mark = re.match(r"^(`{3,}|:{3,})", line)
        if fence is None and mark:
            fence = mark.group(1)
        elif fence is not None and line.strip() == fence:
            fence = None
        elif fence is None and line.startswith("## "):
            title = line[3:].strip()
            sections[title] = []
        sections[title].append(line)
    return sections


def _shown_words(lines):
    """Words a reader meets with every collapsed block closed, by the counter's rules
    (dpbook.tools.reading) applied to the source: no code, no display maths, a collapsed block
    counts its title only, a role or an inline formula one word, a link its text."""
    words, stack, maths = 0, [], False
    for line in lines:
        mark = re.match(r"^(`{3,}|:{3,})\s*(\{(\w+)\})?\s*(.*)$", line)
        if mark and not (stack and line.strip() == stack[-1][0]):
            kind = mark.group(3) or "code"
            stack.append((mark.group(1), kind, False))
            if kind in ("admonition", "exercise", "solution") and mark.group(4):
                words += len(mark.group(4).split()) * (kind != "solution")
            continue
        if stack and line.strip() == stack[-1][0]:
            stack.pop()
            continue
        if stack and line.startswith(":class:"):
            if "dropdown" in line:
                stack[-1] = (stack[-1][0], stack[-1][1], True)
            continue
        if stack and (line.startswith(":label:") or line.startswith(":")):
            continue
        if any(kind == "code" or hidden or kind == "solution" for _, kind, hidden in stack):
            continue
        if line.strip().startswith("$$") or maths:
            maths = (line.strip().count("$$") % 2 == 1) != maths
            continue
        text = re.sub(r"\{[\w:]+\}`[^`]*`", "X", line)  # roles: {term}, {glue:text}, {cite}
        text = re.sub(r"\$[^$]+\$", "X", text)  # inline maths
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links: their text
        text = re.sub(r"[|#*>-]+(?=\s|$)", " ", text)  # table rules, heading and list marks
        words += len(text.split())
    return words


def _evening_words(root, pages):
    here = root.joinpath(*CH04)
    total = 0
    for page, named in pages.items():
        sections = _sections(book_sources.markdown(here / page))
        for title, lines in sections.items():
            if named is None or any(title.startswith(t) for t in OPENING[1:]) or title == "" \
                    or any(title.startswith(n) for n in named):
                total += _shown_words(lines)
    return total


def test_two_evening_path_names_real_sections_and_its_reading_time(root, path_page):
    """The two-evening table names each page's sections by their titles as they stand, and the
    reading time it states is the words of those sections (and each page's opening) at the
    counter's 150 words a minute, to the nearest ten minutes (the source count runs a few per cent
    below the built page's)."""
    here = root.joinpath(*CH04)
    rows = {m.group(1): m.group(2) for m in re.finditer(
        r"^\| \[[^\]]+\]\(([^)]+)\) \| ([^|]*)\|", path_page, flags=re.M)}
    for evening, pages in EVENINGS.items():
        for page, named in pages.items():
            titles = list(_sections(book_sources.markdown(here / page)))
            cell = rows[page]
            quoted = re.findall(r"\"([^\"]+)\"", cell)
            if named is None:
                assert "cả trang" in cell or "cả bài" in cell, (page, cell)
            else:
                assert quoted == named, (page, quoted)
                for name in named:
                    assert sum(t.startswith(name) for t in titles) == 1, (page, name, titles)
        words = _evening_words(root, pages)
        minutes = 10 * round(words / reading.WORDS_PER_MINUTE / 10)
        block = path_page[path_page.index(f"### {evening}"):]
        block = block[:re.search(r"\n##", block[4:]).start() + 4]
        assert f"khoảng {minutes} phút" in _flat(block), (evening, words, minutes)
