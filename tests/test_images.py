"""image() and display() of images with real kernels: result.images, end to end (issue 29).

A chart (matplotlib, Agg and the kernel's default inline backend), a PIL image, files, SVG,
forged types, both budgets, a timeout after an image, per-call and session mode, a
sandboxed kernel, ``display(IPython.display.Image(...))`` counted as the same channel, a
plot that is never displayed showing nothing, and the order among text() blocks. Without a
host (a plain Jupyter client), image() displays the image inline. The host's checks piece by
piece are in ``test_image_frames.py``.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from support import configured, enabled_config

from lemon_exec import ExecuteCode, SessionScope
from lemon_exec.wire import image_types, protocol

pytestmark = [pytest.mark.timeout(120), pytest.mark.kernel]

AGG = "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"


def png_bytes(size: tuple[int, int] = (30, 20)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, "blue").save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("images")
    (root / "pic.png").write_bytes(png_bytes((64, 48)))
    Image.new("RGB", (40, 30), "green").save(root / "photo.jpg", format="JPEG")
    (root / "drawing.svg").write_text(
        '<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg" width="200" '
        'height="100"><circle r="40"/></svg>\n'
    )
    (root / "x.png").write_text("not an image at all\n")
    return root


@pytest.fixture(scope="module")
def ec() -> Iterator[ExecuteCode]:
    with ExecuteCode(enabled_config(kernel_mode="session")) as facade:
        yield facade


@pytest.fixture(params=["per_call", "session"])
def run(request: pytest.FixtureRequest, ec: ExecuteCode, work: Path) -> Any:
    """Run a script in ``work``, per call or in one session (the facade is shared)."""
    scope = SessionScope("images", "agent", cwd=str(work))

    def go(script: str, **kwargs: Any) -> Any:
        if request.param == "per_call":
            with configured(ec, kernel_mode="per_call"):
                return ec.run_sync(script, scope=scope, **kwargs)
        return ec.run_sync(script, scope=scope, **kwargs)

    return go


def shapes(result: Any) -> list[tuple[str, int | None, int | None, int]]:
    return [(i.mime_type, i.width, i.height, i.after_text_blocks) for i in result.images]


def test_a_matplotlib_chart_reaches_the_result(run: Any) -> None:
    result = run(
        AGG + "fig, ax = plt.subplots(figsize=(4, 3), dpi=50)\nax.plot([1, 3, 2])\n"
        "image(fig, alt='a line chart')\nimage(plt)\nimage(ax, format='svg')\n"
    )
    assert result.ok, result.content
    png, same, svg = result.images
    assert png.mime_type == "image/png" and png.alt == "a line chart"
    assert image_types.dimensions(png.data, "image/png") == (png.width, png.height)
    assert 0 < png.width <= 200 and 0 < png.height <= 150  # bbox_inches="tight" trims
    assert same.data == png.data  # image(plt) is the current figure
    assert svg.mime_type == "image/svg+xml" and svg.data.lstrip().startswith(b"<?xml")
    assert result.details["images"] == 3
    assert result.details["image_bytes"] == sum(len(i.data) for i in result.images)
    assert result.to_dict()["images"][0]["alt"] == "a line chart"


def test_pil_images_files_and_svg(run: Any) -> None:
    result = run(
        "from PIL import Image\n"
        "image(Image.new('RGBA', (50, 40), (255, 0, 0, 128)))\n"
        "image(Image.new('RGBA', (50, 40)), format='jpeg')\n"
        "image('pic.png')\nimport pathlib\nimage(pathlib.Path('photo.jpg'))\n"
        "image('drawing.svg', alt='a circle')\n"
        "image(open('pic.png', 'rb').read(), format='image/png')\n"
    )
    assert result.ok, result.content
    assert shapes(result) == [
        ("image/png", 50, 40, 0),
        ("image/jpeg", 50, 40, 0),
        ("image/png", 64, 48, 0),
        ("image/jpeg", 40, 30, 0),
        ("image/svg+xml", 200, 100, 0),
        ("image/png", 64, 48, 0),
    ]
    assert result.images[4].alt == "a circle"


def test_forged_and_unknown_types_are_catchable_tool_errors(run: Any) -> None:
    png = png_bytes()
    result = run(
        f"data = {png!r}\n"
        "for args in [(data, 'jpeg'), ('x.png', None), (b'GIF87a', 'gif'),\n"
        "             (data, 'bmp'), (42, None)]:\n"
        "    try:\n"
        "        image(args[0], format=args[1])\n"
        "        print('shown')\n"
        "    except ToolError as exc:\n"
        "        print('ToolError:', exc)\n"
        "image(data)\n"
    )
    assert result.ok, result.content
    lines = result.content.splitlines()
    assert lines[0] == "ToolError: " + protocol.IMAGE_MISMATCH.format(
        actual="image/png", claimed="image/jpeg"
    )
    assert lines[1].startswith("ToolError: image() data is not a PNG, JPEG, GIF, WebP or SVG")
    assert "given as image/png" in lines[1]
    assert lines[2] == "ToolError: " + protocol.IMAGE_BAD_HEADER.format(actual="image/gif")
    assert lines[3] == "ToolError: image(): unknown format 'bmp'; use png, jpeg, gif, webp or svg"
    assert lines[4].startswith("ToolError: image() cannot show a int")
    assert shapes(result) == [("image/png", 30, 20, 0)]  # earlier refusals cost nothing


def test_over_max_images_and_max_image_bytes_earlier_images_stay(ec: ExecuteCode, run: Any) -> None:
    png = png_bytes()
    script = (
        f"data = {png!r}\nshown = 0\n"
        "for i in range(4):\n"
        "    try:\n"
        "        image(data)\n"
        "        shown += 1\n"
        "    except ToolError as exc:\n"
        "        print(exc)\n"
        "text(f'shown {shown}')\n"
    )
    with configured(ec, max_images=2):
        counted = run(script)
    assert counted.ok, counted.content
    assert len(counted.images) == 2 and counted.details["images"] == 2
    assert "shown 2" in counted.content
    assert counted.content.count(protocol.IMAGE_COUNT_BUDGET.format(limit=2)) == 2

    with configured(ec, max_image_bytes=3 * len(png) - 1):
        sized = run(script)
    assert sized.ok, sized.content
    assert len(sized.images) == 2 and sized.details["image_bytes"] == 2 * len(png)
    assert "image() budget exceeded: this image is" in sized.content
    assert f"max_image_bytes ({3 * len(png) - 1})" in sized.content


def test_an_image_shown_before_a_timeout_is_kept(run: Any) -> None:
    png = png_bytes()
    result = run(f"image({png!r})\ntext('before')\nwhile True:\n    pass\n", timeout_ms=3000)
    assert result.details.get("timed_out") is True, result.content
    assert [i.data for i in result.images] == [png]
    assert result.details["images"] == 1


def test_images_keep_their_place_among_text_blocks(run: Any) -> None:
    png = png_bytes()
    result = run(
        f"data = {png!r}\nimage(data)\ntext('one')\nimage(data)\nimage(data)\n"
        "text('two')\ntext('three')\nimage(data)\n"
    )
    assert [i.after_text_blocks for i in result.images] == [0, 1, 1, 3]


def test_display_of_an_image_is_the_same_channel(ec: ExecuteCode, run: Any) -> None:
    png = png_bytes()
    script = (
        "from IPython.display import Image, display\n"
        f"display(Image(data={png!r}))\n"
        "text('between')\n"
        "try:\n"
        f"    display(Image(data={png!r}))\n"
        "except ToolError as exc:\n"
        "    print('refused:', exc)\n"
    )
    result = run(script)
    assert result.ok, result.content
    assert shapes(result) == [("image/png", 30, 20, 0), ("image/png", 30, 20, 1)]
    assert "IPython.core.display.Image" not in result.content  # no text/plain repr either
    with configured(ec, max_images=1):
        limited = run(script)
    assert len(limited.images) == 1
    assert "refused: " + protocol.IMAGE_COUNT_BUDGET.format(limit=1) in limited.content


def test_the_inline_backend_shows_only_what_the_script_displays(run: Any) -> None:
    # The kernel's default backend (matplotlib-inline): nothing is flushed at the end of a
    # script; plt.show() and display(fig) are displays, so they show.
    quiet = run(
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nfig = plt.figure()\n"
        "fig.add_subplot().bar([1, 2], [3, 4])\ntext(plt.get_backend())\n"
    )
    assert quiet.ok, quiet.content
    assert "inline" in quiet.content
    assert quiet.images == []
    shown = run(
        "import matplotlib.pyplot as plt\nfrom IPython.display import display\n"
        # plt.show() shows every open figure: a session keeps the ones made above.
        "plt.close('all')\nplt.plot([1, 2, 3])\nplt.show()\nfig, ax = plt.subplots()\n"
        "display(fig)\n"
        "plt.close('all')\n"
    )
    assert shown.ok, shown.content
    assert [i.mime_type for i in shown.images] == ["image/png", "image/png"]


def test_a_large_image_is_downscaled_to_max_image_edge(ec: ExecuteCode, run: Any) -> None:
    script = "from PIL import Image\nimage(Image.new('RGB', (3000, 600), 'red'))\n"
    with configured(ec, max_image_edge=1000):
        result = run(script)
    assert result.ok, result.content
    assert shapes(result) == [("image/png", 1000, 200, 0)]
    assert result.details["images_downscaled"] == 1
    [original] = result.details["image_originals"]
    assert image_types.dimensions(Path(original).read_bytes(), "image/png") == (3000, 600)
    with configured(ec, max_image_edge=0):
        kept = run(script)
    assert shapes(kept) == [("image/png", 3000, 600, 0)]


@pytest.mark.bwrap
def test_images_from_a_sandboxed_kernel(work: Path) -> None:
    with ExecuteCode(enabled_config(sandbox="bwrap")) as facade:
        result = facade.run_sync(
            AGG + "fig = plt.figure(figsize=(2, 2), dpi=40)\nimage(fig)\nimage('pic.png')\n",
            scope=SessionScope("images", "sandboxed", cwd=str(work)),
        )
    assert result.ok, result.content
    assert [i.mime_type for i in result.images] == ["image/png", "image/png"]
    assert result.images[1].width == 64


def test_without_a_host_image_displays_inline() -> None:
    from jupyter_client import KernelManager

    km = KernelManager(kernel_name="lemon-python")
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    outputs: list[dict[str, Any]] = []
    try:
        kc.wait_for_ready(timeout=60)
        png = png_bytes()
        reply = kc.execute_interactive(
            f"image({png!r}, alt='blue')\nimage('<svg width=\"3\" height=\"4\"/>')",
            timeout=60,
            output_hook=outputs.append,
        )
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert reply["content"]["status"] == "ok", reply["content"]
    displays = [m["content"]["data"] for m in outputs if m["msg_type"] == "display_data"]
    assert [sorted(d) for d in displays] == [
        ["image/png", "text/plain"],
        ["image/svg+xml", "text/plain"],
    ]
    assert displays[0]["text/plain"] == "blue"
