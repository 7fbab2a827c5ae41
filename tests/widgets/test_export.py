"""``python -m dpbook.widgets export DIR``: standalone, offline, presentation by default."""

import re
import subprocess
import sys

from dpbook.widgets import export


def test_export_writes_every_animation_and_an_index(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dpbook.widgets", "export", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    stems = [stem for stem, _, _ in export.catalogue()]
    index = (tmp_path / "index.html").read_text(encoding="utf-8")
    # teaching order: the index lists the files in catalogue order
    assert re.findall(r'href="([^"]+)\.html"', index) == stems
    for stem in stems:
        html = (tmp_path / f"{stem}.html").read_text(encoding="utf-8")
        assert html.startswith("<!DOCTYPE html>") and 'lang="vi"' in html
        assert 'class="dpb-player dpb-present"' in html  # presentation mode by default
        external = re.findall(r'(?:src|href)="(https?://[^"]+)"', html)
        assert external == [] and "<link" not in html
        assert len(html.encode()) < 1_000_000


def test_export_without_presentation(tmp_path):
    paths = export.export(tmp_path, presentation=False)
    assert all('class="dpb-player"' in p.read_text(encoding="utf-8") for p in paths[1:])
