"""webfetch's HTML conversion: markdownify (MIT), never html2text (GPL-3.0-or-later)."""

from __future__ import annotations

import sys

import pytest

from lemon_exec.tools._webfetch import _html_to_text

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
    out = _html_to_text(PAGE, URL, "markdown")
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
    out = _html_to_text(PAGE, URL, "text")
    assert out.startswith("# Main title\n")
    assert "See the page, bold, `snake_case()`." in out
    assert "](" not in out and "pic" not in out and "__" not in out
    assert "| 1 | 2 |" in out
