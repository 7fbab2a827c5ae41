"""The static player: every frame as inline SVG plus a few lines of JavaScript, nothing else.

One ``Player`` renders to one self-contained HTML fragment (``to_html``) or page
(``standalone_html``). It needs no network, no kernel and no library: the same output works in
the built book opened from disk, in JupyterLab, in classic Notebook and from a USB stick.

Controls: first / previous / play-pause / next / last, a step slider, a speed menu, a
presentation switch (larger text and strokes for a projector) and full screen. Keyboard, when
the player has focus (click it): left/right arrows, space, Home/End, ``f`` (full screen), ``p``
(presentation). Several players on one page are independent: each has its own id and its
script only touches elements inside its own root. Printed (the browser's print, or ``make pdf``),
a player is a filmstrip: every frame, numbered, with its caption, and no controls.

Sizes: on a phone the drawing keeps a readable width and scrolls sideways inside its box; in
full screen and on an exported page (``standalone_html``) the player fills one screen, with the
title, the step counter and the controls in the top row and no scrolling.
"""

from __future__ import annotations

import html
import math
import re
import uuid
from dataclasses import dataclass

from .. import vi
from ..checks import int_at_least


@dataclass(frozen=True)
class Frame:
    """One step of an animation: an ``<svg>`` element and its caption (plain text)."""

    svg: str
    caption: str


_CSS = """
.dpb-player{font-family:"Liberation Sans",Arial,"Noto Sans","DejaVu Sans",sans-serif;
  border:1px solid #bbb;border-radius:8px;padding:10px;margin:12px 0;background:#fff;
  color:#111;outline:none;max-width:100%;box-sizing:border-box}
.dpb-player:focus-visible,.dpb-player:focus{box-shadow:0 0 0 3px #56B4E9}
.dpb-head{display:flex;align-items:baseline;gap:4px 14px;margin-bottom:6px;flex-wrap:wrap}
.dpb-title{font-weight:bold;font-size:1.05em;flex:1 1 12em}
.dpb-home{font-size:1em;color:#0072B2;white-space:nowrap}
.dpb-step{font-variant-numeric:tabular-nums;font-weight:bold;font-size:1.15em;white-space:nowrap}
.dpb-stage{overflow-x:auto;overflow-y:hidden}
.dpb-stage svg{width:100%;height:auto;display:block}
.dpb-frame[hidden]{display:none}
.dpb-caption{min-height:3em;margin:8px 0;font-size:1em;line-height:1.4}
.dpb-controls{display:flex;flex-wrap:wrap;gap:6px;align-items:center}
.dpb-controls button,.dpb-controls select{font-size:0.95em;padding:4px 10px;border:1px solid #888;
  border-radius:5px;background:#f4f4f4;color:#111;cursor:pointer}
.dpb-controls input[type=range]{flex:1;min-width:120px}
.dpb-player svg .t{font-size:17px}
.dpb-player svg .t-small{font-size:{PLAIN_SMALL}px}
.dpb-player svg .t-big{font-size:21px}
.dpb-player svg .stroke{stroke-width:1.5px}
.dpb-player svg .arrow{stroke-width:3px}
/* Presentation (the switch, or full screen): larger text and strokes for a projector. */
.dpb-present .dpb-caption,.dpb-player:fullscreen .dpb-caption{font-size:1.5em}
.dpb-present .dpb-title,.dpb-present .dpb-home,.dpb-player:fullscreen .dpb-title,
  .dpb-player:fullscreen .dpb-home{font-size:1.5em}
.dpb-present .dpb-step,.dpb-player:fullscreen .dpb-step{font-size:1.6em}
.dpb-present .dpb-controls button,.dpb-present .dpb-controls select,
  .dpb-player:fullscreen .dpb-controls button,
  .dpb-player:fullscreen .dpb-controls select{font-size:1.3em}
.dpb-present svg .t,.dpb-player:fullscreen svg .t{font-size:22px}
.dpb-present svg .t-small,.dpb-player:fullscreen svg .t-small{font-size:{PRESENT_SMALL}px}
.dpb-present svg .t-big,.dpb-player:fullscreen svg .t-big{font-size:28px}
.dpb-present svg .stroke,.dpb-player:fullscreen svg .stroke{stroke-width:2.5px}
.dpb-present svg .arrow,.dpb-player:fullscreen svg .arrow{stroke-width:5px}
/* The lecture layout (an exported page, or full screen): one screen, no scrolling. The title,
   counter and controls share the top row; the drawing takes the height the caption (three
   lines kept, so the drawing does not jump between frames) leaves it. */
.dpb-lecture,.dpb-player:fullscreen{display:grid;grid-template-columns:minmax(0,1fr) auto;
  grid-template-rows:auto minmax(0,1fr) auto;grid-template-areas:"head controls" "stage stage"
  "caption caption";column-gap:24px;box-sizing:border-box;height:100vh;width:100%;max-width:none;
  margin:0;padding:8px 24px 10px;border:none;border-radius:0}
.dpb-lecture .dpb-head,.dpb-player:fullscreen .dpb-head{grid-area:head;margin:0;
  align-self:center}
.dpb-lecture .dpb-controls,.dpb-player:fullscreen .dpb-controls{grid-area:controls;
  flex-wrap:nowrap}
.dpb-lecture .dpb-controls input[type=range],.dpb-player:fullscreen .dpb-controls input[type=range]{
  min-width:100px;width:10vw}
.dpb-lecture .dpb-stage,.dpb-player:fullscreen .dpb-stage{grid-area:stage;min-height:0;
  overflow:hidden;margin-top:6px}
.dpb-lecture .dpb-frame,.dpb-player:fullscreen .dpb-frame{height:100%}
.dpb-lecture .dpb-stage svg,.dpb-player:fullscreen .dpb-stage svg{height:100%}
.dpb-lecture .dpb-caption,.dpb-player:fullscreen .dpb-caption{grid-area:caption;
  min-height:3.9em;line-height:1.3;margin:6px 0 0}
.dpb-frame .dpb-cap{display:none}
@media print{
  .dpb-player{border:none;padding:0;break-inside:auto}
  .dpb-controls,.dpb-caption{display:none}
  .dpb-step,.dpb-home{display:none}
  .dpb-stage{display:grid;grid-template-columns:repeat(auto-fill,minmax(45%,1fr));gap:10px 4%;
    overflow:visible}
  /* !important: the book's theme (Bootstrap's reboot) hides [hidden] with !important */
  .dpb-frame,.dpb-frame[hidden]{display:block!important;break-inside:avoid;
    border-top:1px solid #bbb;padding-top:4px}
  .dpb-frame .dpb-cap{display:block;font-size:0.85em;line-height:1.3;margin-top:4px}
  .dpb-num{font-weight:bold}
}
"""

# Kept short on purpose: it only shows one frame, and moves the index on a timer or on input.
_JS = """
(function(){
  var root=document.getElementById("%(id)s"); if(!root) return;
  var frames=root.querySelectorAll(".dpb-frame"), caps=root.querySelectorAll(".dpb-text");
  var cap=root.querySelector(".dpb-caption"), slider=root.querySelector(".dpb-slider");
  var step=root.querySelector(".dpb-step"), play=root.querySelector(".dpb-play");
  var speed=root.querySelector(".dpb-speed"), n=frames.length, i=0, timer=null;
  function show(k){ i=Math.max(0,Math.min(n-1,k));
    for(var j=0;j<n;j++){ frames[j].hidden=(j!==i); }
    cap.textContent=caps[i].textContent; slider.value=i; step.textContent=(i+1)+" / "+n; }
  function stop(){ if(timer){clearInterval(timer);timer=null;} play.textContent="► Phát"; }
  function start(){ if(i>=n-1) show(0);
    timer=setInterval(function(){ if(i>=n-1){stop();} else {show(i+1);} },
                      %(interval)d/parseFloat(speed.value));
    play.textContent="■ Dừng"; }
  function toggle(){ if(timer) stop(); else start(); }
  function full(){ if(document.fullscreenElement){document.exitFullscreen();}
    else if(root.requestFullscreen){root.requestFullscreen();} }
  function present(){ root.classList.toggle("dpb-present"); }
  root.querySelector(".dpb-first").onclick=function(){stop();show(0);};
  root.querySelector(".dpb-prev").onclick=function(){stop();show(i-1);};
  root.querySelector(".dpb-next").onclick=function(){stop();show(i+1);};
  root.querySelector(".dpb-last").onclick=function(){stop();show(n-1);};
  root.querySelector(".dpb-full").onclick=full;
  root.querySelector(".dpb-present-btn").onclick=present;
  play.onclick=toggle;
  slider.oninput=function(){stop();show(parseInt(slider.value,10));};
  speed.onchange=function(){ if(timer){stop();start();} };
  root.addEventListener("click",function(e){ if(e.target.tagName!=="SELECT") root.focus(); });
  var lecture=root.classList.contains("dpb-lecture");
  (lecture?document:root).addEventListener("keydown",function(e){
    var k=e.key, used=true;
    if(k==="ArrowRight"){stop();show(i+1);} else if(k==="ArrowLeft"){stop();show(i-1);}
    else if(k===" "||k==="Spacebar"){toggle();} else if(k==="Home"){stop();show(0);}
    else if(k==="End"){stop();show(n-1);} else if(k==="f"){full();} else if(k==="p"){present();}
    else used=false;
    if(used){e.preventDefault();e.stopPropagation();} });
  show(0);
  if(lecture) root.focus();
})();
"""


# Text sizes in the drawing, in viewBox units: the smallest (``t-small``) sets how wide a drawing
# must be shown for its labels to stay readable.
PLAIN_SMALL_PX, PRESENT_SMALL_PX = 14, 18
PHONE_MIN_LABEL_PX = 11  # the smallest label on a phone, in CSS px


def _css(pid: str, view_width: float) -> str:
    """The shared style, and this player's width on a narrow screen (a phone): there the drawing
    keeps the width at which its smallest text is ``PHONE_MIN_LABEL_PX`` and scrolls sideways
    inside its own box, instead of shrinking to fit (full screen and print: fit again)."""
    def min_width(small_px: float) -> int:
        return math.ceil(view_width * PHONE_MIN_LABEL_PX / small_px)
    css = _CSS.replace("{PLAIN_SMALL}", str(PLAIN_SMALL_PX))
    return (css.replace("{PRESENT_SMALL}", str(PRESENT_SMALL_PX))
            + f"@media (max-width:700px){{"
            f"#{pid} .dpb-stage svg{{min-width:{min_width(PLAIN_SMALL_PX)}px}}"
            f"#{pid}.dpb-present .dpb-stage svg{{min-width:{min_width(PRESENT_SMALL_PX)}px}}"
            f"#{pid}:fullscreen .dpb-stage svg,#{pid}.dpb-lecture .dpb-stage svg{{min-width:0}}}}"
            f"@media print{{#{pid} .dpb-stage svg{{min-width:0!important}}}}")


def _view_width(svg: str) -> float:
    """The width of an ``<svg>``'s viewBox (1000 when it has none: the widgets' usual width)."""
    m = re.search(r'viewBox="\s*[-\d.]+[\s,]+[-\d.]+[\s,]+([\d.]+)', svg)
    return float(m.group(1)) if m else 1000.0


class Player:
    """A sequence of frames and the controls to step through them.

    The step counter (``i / n``, top right) is the only one: a frame's drawing and caption do
    not number the frames themselves, so that two counters cannot disagree."""

    def __init__(self, frames: list[Frame], title: str, presentation: bool = False,
                 interval_ms: int = 1200):
        if not frames:
            raise ValueError("Player cần ít nhất một khung hình (frames rỗng).")
        int_at_least("interval_ms", interval_ms, 50)
        self.frames, self.title = list(frames), title
        self.presentation, self.interval_ms = presentation, interval_ms
        self.id = "dpb-" + uuid.uuid4().hex[:10]

    def to_html(self, home: str | None = None, lecture: bool = False) -> str:
        """A fragment (style, markup, script) that can sit anywhere in a page.

        ``home``: the address of a page to go back to (the lecture export's index), shown as a
        link beside the title. ``lecture``: the player fills the window (an exported page)."""
        last = len(self.frames) - 1
        # Each frame carries its caption: the screen shows one frame and copies its caption
        # below the controls; a printed page shows every frame with its own (a filmstrip).
        stage = "".join(
            f'<div class="dpb-frame"{"" if k == 0 else " hidden"}>{f.svg}'
            f'<p class="dpb-cap"><span class="dpb-num">{k + 1} / {last + 1}.</span> '
            f'<span class="dpb-text">{html.escape(f.caption)}</span></p></div>'
            for k, f in enumerate(self.frames)
        )
        cls = "dpb-player" + (" dpb-present" if self.presentation else "") \
            + (" dpb-lecture" if lecture else "")
        # the value is what the script parses (parseFloat: "0.5"); the label is what a reader
        # sees ("0,5×")
        speeds = "".join(f'<option value="{v}"{" selected" if v == 1 else ""}>'
                         f'{vi.general(v)}×</option>' for v in (0.5, 1, 2, 4))
        back = (f'<a class="dpb-home" href="{html.escape(home)}">← Mục lục</a>'
                if home is not None else "")
        width = max(_view_width(f.svg) for f in self.frames)
        return (
            f"<style>{_css(self.id, width)}</style>"
            f'<div id="{self.id}" class="{cls}" tabindex="0" role="group" '
            f'aria-label="{html.escape(self.title)}">'
            f'<div class="dpb-head">{back}<div class="dpb-title">{html.escape(self.title)}</div>'
            f'<span class="dpb-step" aria-label="Bước">1 / {last + 1}</span></div>'
            f'<div class="dpb-stage">{stage}</div>'
            f'<div class="dpb-caption" aria-live="polite">{html.escape(self.frames[0].caption)}</div>'
            '<div class="dpb-controls">'
            '<button type="button" class="dpb-first" title="Về đầu (Home)">|◀</button>'
            '<button type="button" class="dpb-prev" title="Lùi một bước (←)">◀</button>'
            '<button type="button" class="dpb-play" title="Phát / dừng (phím cách)">► Phát</button>'
            '<button type="button" class="dpb-next" title="Tiến một bước (→)">▶</button>'
            '<button type="button" class="dpb-last" title="Đến cuối (End)">▶|</button>'
            f'<input type="range" class="dpb-slider" min="0" max="{last}" value="0" '
            'aria-label="Bước">'
            f'<select class="dpb-speed" aria-label="Tốc độ">{speeds}</select>'
            '<button type="button" class="dpb-present-btn" title="Chế độ trình chiếu (p)">'
            "Trình chiếu</button>"
            '<button type="button" class="dpb-full" title="Toàn màn hình (f)">Toàn màn hình</button>'
            "</div></div>"
            f"<script>{_JS % {'id': self.id, 'interval': self.interval_ms}}</script>"
        )

    def standalone_html(self, home: str | None = None) -> str:
        """A complete page, for the lecture hall: opens from disk in any browser and fills the
        window (title, drawing, caption and controls on one screen). ``home``: see ``to_html``."""
        return (
            '<!DOCTYPE html><html lang="vi"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{html.escape(self.title)}</title>"
            "<style>html,body{margin:0;padding:0;background:#fff}</style></head><body>"
            f"{self.to_html(home=home, lecture=True)}</body></html>"
        )

    def _repr_html_(self) -> str:
        return self.to_html()
