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


def test_every_frame_carries_its_numbered_caption_for_print():
    """A printed page shows every frame (a filmstrip), so each frame holds its own caption; the
    screen copies the shown frame's caption under the controls."""
    html = _player().to_html()
    frames = re.findall(r'<div class="dpb-frame"( hidden)?><svg></svg><p class="dpb-cap">'
                        r'<span class="dpb-num">(\d) / 2\.</span> <span class="dpb-text">([^<]+)'
                        r'</span></p></div>', html)
    assert frames == [("", "1", "một"), (" hidden", "2", "hai")]
    assert "caps=root.querySelectorAll(\".dpb-text\")" in html
    css = html[html.index("@media print"):]
    assert ".dpb-frame,.dpb-frame[hidden]{display:block!important" in css
    assert ".dpb-controls,.dpb-caption{display:none}" in css
