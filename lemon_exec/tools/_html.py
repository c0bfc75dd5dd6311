"""webfetch's HTML conversion: a page's article as Markdown (or plain text), boilerplate dropped.

Built on :mod:`markdownify` and BeautifulSoup's ``html.parser`` (both MIT). What a reader
of the page would skip is removed before the conversion:

- never text: ``<head>``, scripts, styles, ``<noscript>``, templates, frames, forms and
  their controls, and whatever is ``hidden`` or ``aria-hidden``;
- the page's own content is chosen when it says which it is: the one ``<main>`` (or
  ``role="main"``), else the one ``<article>``;
- around it, the landmarks of a site: navigation, banners, footers, sidebars, search,
  dialogs (cookie banners) by element or ARIA role, and blocks whose class or id names
  boilerplate (breadcrumbs, share buttons, related posts, ads, ...), unless they hold most
  of the page's text (a layout wrapper that happens to be called "sidebar").

Links and images are made absolute against the page's (final) URL in Markdown mode;
``extract_mode="text"`` leaves out links, images and emphasis marks.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

# Elements whose content is never page text.
_DROPPED_TAGS = (
    "head", "script", "style", "noscript", "template", "iframe", "object", "embed", "svg",
    "canvas", "form", "button", "input", "select", "textarea",
)  # fmt: skip
# Site furniture, as elements and as ARIA landmark roles.
_LANDMARK_TAGS = ("nav", "aside", "footer", "header")
_LANDMARK_ROLES = {
    "navigation", "banner", "contentinfo", "complementary", "search", "dialog",
    "alertdialog", "menu", "menubar", "toolbar",
}  # fmt: skip
# Words of a class or id that name boilerplate (split at "-" and "_").
_BOILERPLATE_WORDS = {
    "breadcrumb", "breadcrumbs", "share", "sharing", "social", "related", "cookie",
    "cookies", "consent", "gdpr", "subscribe", "newsletter", "ad", "ads", "advert",
    "advertisement", "sponsor", "sponsored", "promo", "popup", "modal", "sidebar",
    "sidebarwrapper", "comments", "pagination", "pager", "jump", "skip", "masthead",
    "toolbar", "editsection", "headerlink", "trending", "popular", "mostread",
}  # fmt: skip
# ... unless it also names the content (readability's "maybe a candidate").
_CONTENT_WORDS = {"content", "main", "article", "body", "post", "entry", "story", "text"}
# A block holding at least this share of the page's text is content, whatever its name.
_CONTENT_SHARE = 0.5
# What extract_mode='text' leaves out: links and images, and the marks of emphasis.
_TEXT_MODE_STRIPPED = ("a", "img", "em", "i", "strong", "b", "del", "s", "strike")


def html_to_text(html: str, url: str, mode: str) -> str:
    """The readable text of an HTML page: Markdown (``mode="markdown"``) or plain text."""
    # Imported lazily: only webfetch needs them.
    from bs4 import BeautifulSoup
    from markdownify import ATX, UNDERSCORE, MarkdownConverter

    soup = BeautifulSoup(html, "html.parser")
    for element in soup.find_all(_DROPPED_TAGS):
        element.decompose()
    for element in soup.find_all(_is_hidden):
        element.decompose()
    root = _content_root(soup)
    _drop_boilerplate(root)
    if mode == "text":
        converter = MarkdownConverter(
            heading_style=ATX,
            strip=list(_TEXT_MODE_STRIPPED),
            escape_asterisks=False,
            escape_underscores=False,
            escape_misc=False,
        )
    else:
        # Links and images absolute against the page's (final) URL, as a reader needs them.
        for attr, tag in (("href", "a"), ("src", "img")):
            for element in root.find_all(tag, attrs={attr: True}):
                element[attr] = urllib.parse.urljoin(url, str(element[attr]))
        converter = MarkdownConverter(
            heading_style=ATX,
            strong_em_symbol=UNDERSCORE,  # _em_, __strong__
            escape_underscores=False,  # snake_case stays readable; intraword _ is literal
            code_language_callback=_code_language,
        )
    text = converter.convert_soup(root)
    text = re.sub(r"[ \t]+\n", "\n", text)  # markdownify leaves trailing blanks
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def _is_hidden(element: Any) -> bool:
    return bool(element.has_attr("hidden") or element.get("aria-hidden") == "true")


def _content_root(soup: Any) -> Any:
    """The page's one ``<main>`` (or ``role="main"``), else its one ``<article>``, else all."""
    mains = soup.find_all("main") or soup.find_all(attrs={"role": "main"})
    if len(mains) == 1:
        return mains[0]
    articles = soup.find_all("article")
    if len(articles) == 1:
        return articles[0]
    return soup.body or soup


def _drop_boilerplate(root: Any) -> None:
    total = len(root.get_text(" ", strip=True)) or 1
    for element in list(root.find_all(True)):
        if element.decomposed or not _is_boilerplate(element):
            continue
        if len(element.get_text(" ", strip=True)) / total >= _CONTENT_SHARE:
            continue  # a wrapper of the content, whatever it is called
        element.decompose()


def _is_boilerplate(element: Any) -> bool:
    if element.name in _LANDMARK_TAGS:
        # The content's own header and footer (its title, its byline) are content.
        return element.name in ("nav", "aside") or not _inside_content(element)
    if str(element.get("role", "")).lower() in _LANDMARK_ROLES:
        return True
    names = [*element.get("class", ()), str(element.get("id", ""))]
    words = {w for name in names for w in re.split(r"[-_\s]+", name.lower()) if w}
    words |= {re.sub(r"[-_]", "", name.lower()) for name in names}  # "most-read" -> mostread
    return bool(words & _BOILERPLATE_WORDS) and not words & _CONTENT_WORDS


def _inside_content(element: Any) -> bool:
    return (
        element.find_parent(("article", "main")) is not None
        or element.find_parent(attrs={"role": "main"}) is not None
    )


def _code_language(pre: Any) -> str | None:
    """The language of a ``<pre>`` block from a ``language-x`` class (on it or its ``<code>``)."""
    for element in (pre, pre.find("code")):
        classes = element.get("class") if element is not None else None
        for name in classes or ():
            if name.startswith(("language-", "lang-")):
                return str(name.split("-", 1)[1])
    return None
