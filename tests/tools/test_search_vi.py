"""Vietnamese search: folded index words, pairs of neighbouring words, glossary aliases."""

import unicodedata

import pytest

from dpbook.tools import search_vi


def test_fold_drops_diacritics_and_lowers():
    assert search_vi.fold("Bộ nhớ ĐỈNH") == "bo nho dinh"
    assert search_vi.fold(unicodedata.normalize("NFD", "đỉnh")) == "dinh"
    with pytest.raises(ValueError, match="chuỗi"):
        search_vi.fold(3)


def test_index_words_are_folded_with_neighbour_pairs():
    lang = search_vi.SearchVietnamese({})
    words = [lang.stem(w) for w in lang.split("Bộ nhớ đỉnh")]
    assert words == ["bo", "nho", "dinh", "bo_nho", "nho_dinh"]
    # the browser folds the query the same way (the Stemmer of language_data.js)
    assert 'normalize("NFD")' in lang.js_stemmer_code and "var Stemmer" in lang.js_stemmer_code


def test_gloss_is_read_from_the_definition():
    assert search_vi.gloss_aliases("peak memory", "Bộ nhớ đỉnh: lượng bộ nhớ") == [
        "peak memory", "Bộ nhớ đỉnh"]
    assert search_vi.gloss_aliases("hook", "Hook (hàm móc): hàm mà") == ["hook", "hàm móc"]
    assert search_vi.gloss_aliases("DataParallel (DP)", "no colon")[:2] == ["DataParallel", "DP"]
    # a description, not a name: no alias
    assert search_vi.gloss_aliases("find_unused_parameters", "Tùy chọn của DDP: sau") == [
        "find_unused_parameters"]


def test_a_page_gets_the_names_it_lacks():
    groups = [["peak memory", "Bộ nhớ đỉnh"], ["hook", "hàm móc"]]
    assert search_vi.aliases_for("Đo bộ nhớ đỉnh thật.", groups) == ["peak memory"]
    assert search_vi.aliases_for("nothing here", groups) == []
