"""Reading the dashboard's pages in tests as a person would: an element's text by id, a table's
cells, the links, the inline SVG charts (parsed as XML, so a chart that is not well-formed fails)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from html.parser import HTMLParser

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    children: list[Node | str] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The text within, whitespace collapsed."""
        parts: list[str] = []

        def walk(node: Node) -> None:
            for child in node.children:
                if isinstance(child, str):
                    parts.append(child)
                else:
                    walk(child)

        walk(self)
        return " ".join("".join(parts).split())

    def iter(self, tag: str | None = None) -> list[Node]:
        found: list[Node] = []
        for child in self.children:
            if isinstance(child, Node):
                if tag is None or child.tag == tag:
                    found.append(child)
                found += child.iter(tag)
        return found


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(Node(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(data)


class Page:
    """A page's HTML, parsed."""

    def __init__(self, html: str) -> None:
        self.html = html
        builder = _Builder()
        builder.feed(html)
        builder.close()
        self.root = builder.root

    def by_id(self, ident: str) -> Node:
        found = [n for n in self.root.iter() if n.attrs.get("id") == ident]
        assert len(found) == 1, f"{len(found)} elements with id {ident!r}"
        return found[0]

    def has(self, ident: str) -> bool:
        return any(n.attrs.get("id") == ident for n in self.root.iter())

    def text(self, ident: str) -> str:
        return self.by_id(ident).text

    def table(self, ident: str) -> list[list[str]]:
        """The rows of a table, header row included, each a list of its cells' text."""
        return [
            [cell.text for cell in row.children if isinstance(cell, Node)]
            for row in self.by_id(ident).iter("tr")
        ]

    def links(self, within: str | None = None) -> list[tuple[str, str]]:
        """(href, text) of every link (in the element with id `within`)."""
        root = self.by_id(within) if within else self.root
        return [(a.attrs.get("href", ""), a.text) for a in root.iter("a")]

    def svg(self, ident: str) -> ET.Element:
        """The inline SVG whose title has id ``<ident>-title``, parsed as XML."""
        for match in re.finditer(r"<svg\b.*?</svg>", self.html, re.S):
            if f'id="{ident}-title"' in match.group(0):
                return ET.fromstring(match.group(0))
        raise AssertionError(f"no chart {ident!r} in the page")


SVG = "{http://www.w3.org/2000/svg}"
