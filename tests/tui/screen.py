"""The text a screen shows, read back from Textual's SVG screenshot (the same picture the
snapshot tests keep): a check that a dialog's words are on screen whole, not cut."""

from __future__ import annotations

import html
import re
from collections import defaultdict

_TEXT = re.compile(r'<text class="[^"]*" x="([\d.]+)" y="[\d.]+" textLength="[\d.]+" '
                   r'clip-path="url\(#[\w-]+-line-(\d+)\)">([^<]*)</text>')
#: The width of one cell in Textual's screenshots, in SVG units.
CELL = 12.2


def screen_lines(svg: str) -> list[str]:
    """The screen's lines as text: each line's runs of text put at their columns."""
    rows: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for match in _TEXT.finditer(svg):
        column = round(float(match[1]) / CELL)
        text = html.unescape(match[3]).replace("\xa0", " ").rstrip("\n")
        rows[int(match[2])].append((column, text))
    lines = []
    for number in range(max(rows, default=-1) + 1):
        line = ""
        for column, text in sorted(rows.get(number, [])):
            line = line.ljust(column)[:column] + text
        lines.append(line)
    return lines


def dialog_lines(lines: list[str], border: str = "█") -> list[str]:
    """What is inside a dialog's thick border, line by line (the screen behind it, left
    and right, is left out)."""
    inside = []
    for line in lines:
        first, last = line.find(border), line.rfind(border)
        if first != last:
            inside.append(line[first + 1:last])
    return inside


def words_on(lines: list[str], frame: str = "▊▎█▌▐│┃") -> str:
    """The screen's words in reading order, one space apart, borders left out: a text
    wrapped over several lines reads as it was written."""
    text = " ".join(lines)
    for mark in frame:
        text = text.replace(mark, " ")
    return " ".join(text.split())


def shows_whole(lines: list[str], text: str) -> bool:
    """``text`` is on screen, word for word (wrapping aside)."""
    return " ".join(text.split()) in words_on(lines)
