import re

import pytest

from dpbook.widgets.player import Frame, Player


def _player():
    return Player([Frame("<svg></svg>", "một"), Frame("<svg></svg>", "hai")], "Thử")


def test_speed_menu_shows_a_decimal_comma_and_keeps_a_value_the_script_parses():
    html = _player().to_html()
    options = re.findall(r'<option value="([^"]+)"( selected)?>([^<]+)</option>', html)
    assert [(value, label) for value, _, label in options] == \
        [("0.5", "0,5×"), ("1", "1×"), ("2", "2×"), ("4", "4×")]
    assert [value for value, selected, _ in options if selected] == ["1"]
    assert "parseFloat(speed.value)" in html  # the script reads the value, not the label
    assert all(float(value) > 0 for value, _, _ in options)


def test_a_player_needs_frames():
    with pytest.raises(ValueError, match="frames"):
        Player([], "Thử")
