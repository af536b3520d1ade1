"""What every text view shares (a trace's, a comparison's, a part fed one row, an attribution's, a
patching sweep's): numbers at a chosen number of decimals, a token escaped and cut, a row cut to a
width, and words packed into lines. The only arithmetic here is the mean, standard deviation
(biased) and norm printed for rows too wide to show in full.
"""

from __future__ import annotations

import math

from ..errors import MinigptError

WIDTH = 80
MAX_DIGITS = 15
TOKEN_SHOWN = 16  # a token's escaped text is cut to this many characters in tables


def check_digits(digits: int) -> None:
    if not 0 <= digits <= MAX_DIGITS:
        raise MinigptError(
            "{digits} {given} is out of range; show 0..{MAX_DIGITS} decimals",
            given=digits,
            MAX_DIGITS=MAX_DIGITS,
        )


def number(value: float, digits: int) -> str:
    """Fixed decimals; a value that rounds to zero prints without a minus sign."""
    text = f"{value:.{digits}f}"
    if text.startswith("-") and float(text) == 0.0:
        text = text[1:]
    return text


def magnitude(value: float, digits: int) -> str:
    """A norm that may span many orders (a gradient's): fixed decimals from 0.001 to 10,000, else
    in scientific notation, so a vanishing gradient does not print as zero."""
    if value == 0 or 1e-3 <= abs(value) < 1e4:
        return number(value, digits)
    return f"{value:.{max(1, digits - 1)}e}"


def show_token(text: str, limit: int = TOKEN_SHOWN) -> str:
    """Escaped like a Python string (a newline shows as \\n), cut to `limit` characters."""
    shown = repr(text)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def row_lines(row: list[float], digits: int, room: int) -> list[str]:
    """The row in full if it fits `room` characters; else its first coordinates, an ellipsis, and a
    second line with its mean, standard deviation (biased) and norm."""
    parts = [number(v, digits) for v in row]
    full = "[" + ", ".join(parts) + "]"
    if len(full) <= room:
        return [full]
    shown = len(parts) - 1
    while shown > 1 and len("[" + ", ".join(parts[:shown]) + ", ...]") > room:
        shown -= 1
    n = len(row)
    mean = math.fsum(row) / n
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in row) / n)
    norm = math.sqrt(math.fsum(v * v for v in row))
    stats = [f"mean {number(mean, digits)}", f"std {number(std, digits)}", f"norm {number(norm, digits)}"]
    return ["[" + ", ".join(parts[:shown]) + ", ...]"] + pack(stats, room, "  ")


def pack(items: list[str], room: int, sep: str) -> list[str]:
    """Greedy lines of `items` joined by `sep`, each at most `room` characters where possible."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + len(sep) + len(item) <= room:
            lines[-1] += sep + item
        else:
            lines.append(item)
    return lines


def shape_text(shape: list[int]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"
