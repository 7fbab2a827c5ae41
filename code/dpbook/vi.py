"""How a number looks to a Vietnamese reader: one formatter for the whole package.

The rules are those of ``notes/thuat-ngu.md`` ("Numbers and units"): a decimal comma
(``1,5``), thousands grouped by a space (never ``6,738,415,616``, which reads as a decimal, and
never ``2.788``), decimal units (``GB`` = 10⁹ B) unless the unit says ``GiB``/``MiB``/``KiB``.
``number`` does the work; the other functions are the shapes the pages and widgets use.
"""

from __future__ import annotations

from .style import GB, KB, MB

NARROW_NBSP = "\u202f"  # the thousands separator of the book's prose and printed outputs


def _vietnamese(text: str, group: str = "") -> str:
    """Python's ``1,234.5`` as the book writes it: ``1 234,5`` (``group`` between thousands)."""
    return text.replace(",", "\0").replace(".", ",").replace("\0", group)


def number(x: float, decimals: int = 0, *, trim: bool = False, group: str = "",
           sign: bool = False) -> str:
    """``x`` with ``decimals`` digits after a decimal comma; ``trim`` drops trailing zeros (and
    the comma); ``group`` separates thousands (``NARROW_NBSP`` in prose, a plain space where a
    renderer measures text by characters); ``sign`` writes ``+`` before a positive number."""
    spec = ("+" if sign else "") + ("," if group else "") + f".{decimals}f"
    text = format(x, spec)
    if trim and "." in text:
        text = text.rstrip("0").rstrip(".")
    return _vietnamese(text, group)


def general(x: float, digits: int = 6) -> str:
    """Python's ``:g`` (``digits`` significant digits, no trailing zeros, an exponent for very
    large or small numbers) with a decimal comma: ``0,875``, ``7e+09``."""
    return _vietnamese(format(x, f".{digits}g"))


_SUPERSCRIPT = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")


def sci(x: float, decimals: int = 1) -> str:
    """Scientific notation as a reader writes it: ``1,2·10⁻⁷`` (``0`` stays ``0``)."""
    if x == 0:
        return "0"
    mantissa, exponent = format(x, f".{decimals}e").split("e")
    return f"{_vietnamese(mantissa)}·10{str(int(exponent)).translate(_SUPERSCRIPT)}"


def percent(fraction: float, decimals: int = 1) -> str:
    """A fraction as a percentage: ``0.125`` -> ``12,5%``."""
    return f"{number(100 * fraction, decimals)}%"


def short(x: float) -> str:
    """Three significant digits at most, zeros trimmed: ``10,8``, ``6,74``, ``124``."""
    return number(x, 0 if x >= 100 else 1 if x >= 10 else 2, trim=True)


def nbytes(n: float) -> str:
    """Bytes with the largest decimal unit that fits: ``10,8 GB``, ``3,2 MB``, ``512 B``."""
    for unit, scale in (("GB", GB), ("MB", MB), ("KB", KB)):
        if n >= scale:
            return f"{short(n / scale)} {unit}"
    return f"{short(n)} B"


def count(n: int) -> str:
    """A parameter count in Vietnamese words: ``6,74 tỷ``, ``124 triệu``."""
    if n >= 1e9:
        return f"{short(n / 1e9)} tỷ"
    return f"{short(n / 1e6)} triệu" if n >= 1e6 else str(n)


def grouped(n: float, sep: str = NARROW_NBSP) -> str:
    """An integer with its thousands grouped: ``22 304``."""
    return number(n, 0, group=sep)


def ms(seconds: float, decimals: int = 2) -> str:
    """A duration in milliseconds: ``1,25 ms``."""
    return f"{number(seconds * 1e3, decimals)} ms"


def glue(key: str, text: str) -> str:
    """Hand ``text`` (a number already written by this module) to myst-nb as ``key``, so that the
    page's prose pastes it with ``{glue:text}`key``` instead of typing it; returns ``text``.
    Outside a notebook kernel (a test calling a page's code) nothing is pasted."""
    try:
        from myst_nb import glue as myst_glue
        from IPython import get_ipython
    except ImportError:
        return text
    if get_ipython() is not None:
        myst_glue(key, text, display=False)
    return text
