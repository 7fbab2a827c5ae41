"""``dpbook.vi``: the one formatter of numbers a reader sees (``notes/thuat-ngu.md``)."""

import pytest

from dpbook import style, vi


@pytest.mark.parametrize("x, decimals, trim, group, text", [
    (1.5, 1, False, "", "1,5"),
    (0.0953, 3, False, "", "0,095"),
    (2.50, 2, True, "", "2,5"),
    (3.0, 2, True, "", "3"),
    (6_738_415_616, 0, False, vi.NARROW_NBSP, "6\u202f738\u202f415\u202f616"),
    (1234.5, 1, False, " ", "1 234,5"),
])
def test_decimal_comma_and_grouped_thousands(x, decimals, trim, group, text):
    assert vi.number(x, decimals, trim=trim, group=group) == text


def test_no_vietnamese_reader_sees_a_point_as_decimal_or_a_comma_as_thousands():
    for x in (0.5, 12.25, 1234.5, 2788):
        for text in (vi.number(x, 2), vi.short(x), vi.grouped(x), vi.nbytes(x * 1e6)):
            assert "." not in text
    assert "," not in vi.grouped(2788) and vi.grouped(2788) == "2\u202f788"


@pytest.mark.parametrize("n, text", [(10.78e9, "10,8 GB"), (107.8e9, "108 GB"), (3.2e6, "3,2 MB"), (512, "512 B"),
                                     (1500, "1,5 KB"), (24e9, "24 GB")])
def test_bytes_take_the_largest_decimal_unit(n, text):
    assert vi.nbytes(n) == text


def test_counts_in_words_and_milliseconds():
    assert vi.count(6_738_415_616) == "6,74 tỷ" and vi.count(124_439_808) == "124 triệu"
    assert vi.count(2788) == "2788"
    assert vi.ms(0.00125) == "1,25 ms" and vi.ms(0.5, 0) == "500 ms"


def test_one_palette_one_set_of_sizes():
    assert style.GB == 1e9 and style.GIB == 2**30 and style.MIB == 2**20
    assert not hasattr(style, "GPUS_GB")  # the cards are memory.CARDS, in bytes
    assert style.rank_colour(0) == style.PALETTE["orange"] == style.rank_colour(8)
    assert style.series_colour(0) == style.PALETTE["blue"]
    assert all(c.startswith("#") and len(c) == 7 for c in style.PALETTE.values())


def test_the_shapes_of_printed_numbers():
    assert vi.number(0.5, 4, sign=True) == "+0,5000" and vi.number(-0.5, 4, sign=True) == "-0,5000"
    assert vi.number(6_738_415_616, 0, group=vi.NARROW_NBSP) == "6\u202f738\u202f415\u202f616"
    assert vi.general(0.875) == "0,875" and vi.general(7e9) == "7e+09" and vi.general(25) == "25"
    assert vi.general(1 / 3, 3) == "0,333"
    assert vi.sci(1.23e-7) == "1,2·10⁻⁷" and vi.sci(3.4e12, 2) == "3,40·10¹²" and vi.sci(0) == "0"
    assert vi.sci(-2.5e-13) == "-2,5·10⁻¹³"
    assert vi.percent(0.125) == "12,5%" and vi.percent(1, 0) == "100%"
