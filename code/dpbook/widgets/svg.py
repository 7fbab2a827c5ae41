"""A tiny SVG builder: shapes with CSS classes, so the player can restyle them for projection.

Text and strokes carry classes (``t``, ``t-small``, ``t-big``, ``stroke``) instead of fixed
sizes alone: the player's stylesheet enlarges them in presentation mode without redrawing.
Arrowheads are polygons, not ``<marker>``s, because marker ids collide between the many SVGs of
one page and markers inside hidden frames do not render in every browser.
"""

from __future__ import annotations

import html
import math

class Svg:
    """Collects elements; ``render()`` returns one ``<svg>`` element scaled by its viewBox."""

    def __init__(self, width: float, height: float, label: str):
        self.width, self.height, self.label = width, height, label
        self._parts: list[str] = []

    def rect(self, x, y, w, h, fill="none", stroke="#333333", cls="stroke", rx=4, opacity=1.0):
        self._parts.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" rx="{rx}" '
            f'fill="{fill}" stroke="{stroke}" class="{cls}" fill-opacity="{opacity}"/>'
        )
        return self

    def text(self, x, y, content, cls="t", anchor="middle", fill="#111111", weight="normal"):
        self._parts.append(
            f'<text x="{x:.1f}" y="{y:.1f}" class="{cls}" text-anchor="{anchor}" '
            f'dominant-baseline="middle" fill="{fill}" font-weight="{weight}">'
            f"{html.escape(str(content))}</text>"
        )
        return self

    def line(self, x1, y1, x2, y2, stroke="#333333", cls="stroke", dash=None):
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        self._parts.append(
            f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
            f'stroke="{stroke}" class="{cls}"{dash_attr}/>'
        )
        return self

    def arrow(self, x1, y1, x2, y2, colour="#333333", head=12.0, cls="stroke arrow"):
        """A line ending in a filled triangular head at (x2, y2)."""
        angle = math.atan2(y2 - y1, x2 - x1)
        bx, by = x2 - head * math.cos(angle), y2 - head * math.sin(angle)
        self.line(x1, y1, bx, by, stroke=colour, cls=cls)
        left = (bx + head * 0.5 * math.sin(angle), by - head * 0.5 * math.cos(angle))
        right = (bx - head * 0.5 * math.sin(angle), by + head * 0.5 * math.cos(angle))
        pts = " ".join(f"{px:.1f},{py:.1f}" for px, py in ((x2, y2), left, right))
        self._parts.append(f'<polygon points="{pts}" fill="{colour}"/>')
        return self

    def raw(self, fragment: str):
        self._parts.append(fragment)
        return self

    def render(self) -> str:
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {self.width:.0f} '
            f'{self.height:.0f}" role="img" aria-label="{html.escape(self.label)}" '
            f'font-family="Liberation Sans, Arial, Helvetica, sans-serif">'
            + "".join(self._parts)
            + "</svg>"
        )
