"""A check that a figure file holds a drawn plot, not only that a file exists."""

from pathlib import Path

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_png_drawn(path: Path, min_coloured_pixels: int = 200) -> None:
    """`path` is a PNG with data drawn in colour. A figure whose axes were left empty (frame, ticks, labels and
    title only) is black, white and grey, so it fails; bars, curves, markers and colour maps pass."""
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == PNG_SIGNATURE, f"{path.name} is not a PNG file"
    pixels = imread(path)[..., :3]
    coloured = int(((pixels.max(axis=-1) - pixels.min(axis=-1)) > 0.25).sum())
    assert coloured >= min_coloured_pixels, f"{path.name}: {coloured} coloured pixels, nothing seems drawn"
