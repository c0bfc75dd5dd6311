"""webfetch's HTML conversion: markdownify (MIT), never html2text (GPL-3.0-or-later)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from lemon_exec.tools._html import html_to_text

from .conftest import Invoke

pytestmark = pytest.mark.timeout(10)

PAGE = """<!DOCTYPE html><html><head><title>Head title</title></head><body>
<h1>Main <em>title</em></h1>
<p>See <a href="rel/page?x=1">the page</a>, <strong>bold</strong>, <code>snake_case()</code>.</p>
<ul><li>one</li><li>two<ul><li>nested</li></ul></li></ul>
<pre><code class="language-python">def f(x):
    return x * 2
</code></pre>
<table><tr><th>A</th><th>B</th></tr><tr><td>1</td><td>2</td></tr></table>
<img src="img/x.png" alt="pic"><noscript>enable js</noscript><template>tmpl</template>
</body></html>"""
URL = "https://example.com/dir/index.html"


def test_webfetch_does_not_need_html2text(
    http_base: str, invoke: Invoke, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "html2text", None)  # `import html2text` now fails
    out = invoke("webfetch", url=f"{http_base}/page.html")
    assert "# Hello Lemon" in out
    assert f"[a link]({http_base}/docs)" in out


def test_markdown_keeps_the_structure_with_absolute_links() -> None:
    out = html_to_text(PAGE, URL, "markdown")
    assert out.startswith("# Main _title_\n")
    assert "[the page](https://example.com/dir/rel/page?x=1)" in out
    assert "__bold__" in out and "`snake_case()`" in out
    assert "* one\n* two\n  + nested" in out
    assert "```python\ndef f(x):\n    return x * 2\n```" in out
    assert "| A | B |\n| --- | --- |\n| 1 | 2 |" in out
    assert "![pic](https://example.com/dir/img/x.png)" in out
    for dropped in ("Head title", "enable js", "tmpl"):
        assert dropped not in out
    assert "\n\n\n" not in out and out.endswith("\n") and not out.endswith("\n\n")


def test_text_mode_drops_links_images_and_emphasis_marks() -> None:
    out = html_to_text(PAGE, URL, "text")
    assert out.startswith("# Main title\n")
    assert "See the page, bold, `snake_case()`." in out
    assert "](" not in out and "pic" not in out and "__" not in out
    assert "| 1 | 2 |" in out


PAGES = Path(__file__).parent / "data" / "pages"
EXPECTATIONS = json.loads((PAGES / "expectations.json").read_text())


@pytest.mark.parametrize("page", sorted(k for k in EXPECTATIONS if not k.startswith("_")))
def test_saved_pages_keep_the_article_and_drop_the_boilerplate(page: str) -> None:
    """Side by side on these pages (docs/tools.md): html2text and the converter before this
    one kept 27 of the 36 boilerplate phrases; none may remain, and no article text may go."""
    expected = EXPECTATIONS[page]
    out = html_to_text((PAGES / page).read_text(), "https://example.org/path/page.html", "markdown")
    assert [p for p in expected["article"] if p not in out] == [], out
    assert [p for p in expected["boilerplate"] if p in out] == [], out
    lines = out.splitlines()
    for want in expected["markdown"]:
        assert want in lines or want in out, (want, out)
    text = html_to_text((PAGES / page).read_text(), "https://example.org/", "text")
    assert [p for p in expected["boilerplate"] if p in text] == [], text
    assert "](" not in text  # no link syntax in text mode


def test_a_wrapper_named_like_boilerplate_is_kept_when_it_holds_the_content() -> None:
    html = (
        "<html><body><div class='sidebar-layout'><h1>Title</h1><p>"
        + "Body text of the page. " * 20
        + "</p></div><div class='share'>Share this</div></body></html>"
    )
    out = html_to_text(html, URL, "markdown")
    assert "Body text of the page." in out and "# Title" in out
    assert "Share this" not in out


def test_the_content_s_own_header_and_footer_stay() -> None:
    html = (
        "<body><header>Site name</header><main><header><h1>Post</h1><p>by Ada</p></header>"
        "<p>Text.</p><footer>Filed under: tests</footer></main><footer>(c) site</footer></body>"
    )
    out = html_to_text(html, URL, "markdown")
    assert "# Post" in out and "by Ada" in out and "Filed under: tests" in out
    assert "Site name" not in out and "(c) site" not in out
