"""The book's figure style: one palette, one size, one look for every chapter's figures.

``apply_book_style`` also watches every figure it styles: when a figure is drawn (shown in a
notebook, or saved by Quarto), text that overlaps other text or runs off the figure is reported
as a ``FigureTextWarning`` naming the two texts, so a crowded label shows in the cell's output and
the book's tests, which refuse any such warning in the rendered pages, fail on it.
"""

from __future__ import annotations

import warnings

# The book's colours, in the order plots use them: blue, rust, green, violet, ochre, slate.
PALETTE: tuple[str, ...] = ("#1f5f8b", "#c4512d", "#4f8a3c", "#7a4fa0", "#c99a12", "#5c6670")

# One colour per cache design, wherever a figure draws it (Chapter 10, 7, 8 and 9): the full
# cache slate, and the caches that store fewer heads in lighter and darker slates beside it (MHA
# darker, MQA lighter, GQA-8 the full cache itself), the latent cache in rose; the caches that
# keep every entry in fewer bits in blues, greens and violets; the evicting ones in warm colours
# and browns.
DESIGN_COLOURS: dict[str, str] = {
    "full": PALETTE[5], "int8": PALETTE[0], "int4": PALETTE[2], "kivi4": "#a58bc9",
    "kivi2": PALETTE[3], "streaming": PALETTE[1], "snapkv": PALETTE[4], "pyramidkv": "#8a6d0b",
    "window": "#8c564b", "sinks": "#d98b6f", "h2o": "#2a9d8f",
    "mha": "#2b2f33", "gqa8": PALETTE[5], "mqa": "#9aa5b1", "latent": "#c2456b", "kivi8": "#5d9bd5",
}


def apply_book_style() -> None:
    """Set matplotlib's defaults to the book's figure style; returns None.

    One figure size, resolution, font scale, light grid and colour cycle (from
    ``PALETTE``) for every chapter. Only ``matplotlib.rcParams`` changes: the
    backend is left alone, so Quarto and Jupyter keep their own.
    """
    import matplotlib as mpl
    from cycler import cycler

    mpl.rcParams.update(
        {
            "figure.figsize": (6.4, 3.6),
            "figure.dpi": 110,
            "savefig.dpi": 150,
            "font.size": 10,
            "axes.titlesize": 11,
            "axes.labelsize": 10,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "grid.linewidth": 0.6,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.prop_cycle": cycler(color=list(PALETTE)),
            "lines.linewidth": 1.8,
            "legend.frameon": False,
            "figure.hooks": ["longctx.support.style:watch_figure"],
        }
    )


class FigureTextWarning(UserWarning):
    """Text in a figure overlaps other text or runs off the figure."""


def _texts(fig) -> list:
    """Return the text artists of ``fig`` that a draw shows.

    Titles, labels, legends, notes, and the tick labels each axis draws (an axis keeps
    labels for ticks outside its view, unshown).
    """
    from matplotlib.axis import Tick
    from matplotlib.text import Text

    shown = []
    for ax in fig.get_axes():
        for axis in ax._axis_map.values():
            for tick in axis._update_ticks():
                shown += [label for label in (tick.label1, tick.label2) if label.get_visible()]
    tick_labels = {id(label) for ax in fig.get_axes() for axis in ax._axis_map.values()
                   for tick in axis.get_major_ticks() + axis.get_minor_ticks()
                   for label in (tick.label1, tick.label2)}
    for artist in fig.findobj(Text):
        if id(artist) not in tick_labels and not isinstance(artist.axes, Tick) and artist.get_visible():
            shown.append(artist)
    return [text for text in shown if text.get_text().strip()]


def text_problems(fig, renderer=None, *, slack: float = 1.0) -> list[str]:
    """Return what is wrong with ``fig``'s text as ``renderer`` draws it (default: a fresh draw).

    Each problem is one line: two texts whose boxes overlap by more than ``slack`` pixels each
    way (tick labels of one axis included), or a text that its axes clips because it reaches
    past the axes' edge.
    """
    if renderer is None:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
    from matplotlib.text import Text

    boxes = []
    for text in _texts(fig):
        box = Text.get_window_extent(text, renderer)  # the words, not an annotation's arrow
        if box.width > 0 and box.height > 0:
            boxes.append((text, box))
    problems = []
    for index, (text, box) in enumerate(boxes):
        clip = text.get_clip_box() if text.get_clip_on() else None
        if clip is not None and (box.x0 < clip.x0 - slack or box.x1 > clip.x1 + slack
                                 or box.y0 < clip.y0 - slack or box.y1 > clip.y1 + slack):
            problems.append(f"{text.get_text()!r} is cut off at its axes' edge")
        for other, other_box in boxes[index + 1:]:
            wide = min(box.x1, other_box.x1) - max(box.x0, other_box.x0)
            tall = min(box.y1, other_box.y1) - max(box.y0, other_box.y0)
            if wide > slack and tall > slack:
                problems.append(f"{text.get_text()!r} overlaps {other.get_text()!r}")
    return problems


def _report_on_draw(event) -> None:
    if getattr(event.canvas.figure, "_spreading_labels", False):
        return  # spread_labels is still moving them
    for problem in text_problems(event.canvas.figure, event.renderer):
        warnings.warn(f"figure text: {problem}", FigureTextWarning, stacklevel=2)


def watch_figure(fig) -> None:
    """Report ``fig``'s text problems each time it is drawn (a ``figure.hooks`` entry)."""
    fig.canvas.mpl_connect("draw_event", _report_on_draw)


def spread_labels(fig, labels: list, *, step: float = 7.0, tries: int = 12) -> None:
    """Move ``labels`` (annotations placed with offsets in points) apart until none overlap.

    Each pass draws ``fig`` and moves the later of every overlapping pair ``step`` points down
    (or up, when it already sits below the first); after ``tries`` passes the rest is left for
    the figure's text watch to report. Returns None.
    """
    fig._spreading_labels = True
    try:
        _spread(fig, labels, step, tries)
    finally:
        fig._spreading_labels = False


def _marker_boxes(fig, renderer) -> list:
    """A box around every scatter mark of ``fig``, in pixels."""
    from matplotlib.collections import PathCollection
    from matplotlib.transforms import Bbox

    boxes = []
    for ax in fig.get_axes():
        for marks in ax.collections:
            if not isinstance(marks, PathCollection) or not len(marks.get_offsets()):
                continue
            centres = marks.get_offset_transform().transform(marks.get_offsets())
            sizes = marks.get_sizes() if len(marks.get_sizes()) else [36.0]
            for index, (x, y) in enumerate(centres):
                half = (sizes[index % len(sizes)] ** 0.5) * fig.dpi / 72 / 2
                boxes.append(Bbox.from_extents(x - half, y - half, x + half, y + half))
    return boxes


def _spread(fig, labels: list, step: float, tries: int) -> None:
    from matplotlib.text import Text

    def meets(a, b) -> bool:
        return min(a.x1, b.x1) - max(a.x0, b.x0) > 1 and min(a.y1, b.y1) - max(a.y0, b.y0) > 1

    for _ in range(tries):
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        boxes = [Text.get_window_extent(label, renderer) for label in labels]
        marks = _marker_boxes(fig, renderer)
        moved = False
        for later, label in enumerate(labels):
            own = label.axes.transData.transform(label.xy)  # the point it names
            blocked = [m for m in marks if not m.contains(*own)]
            hit = next((boxes[e] for e in range(later) if meets(boxes[e], boxes[later])), None)
            if hit is None and any(meets(m, boxes[later]) for m in blocked):
                hit = boxes[later]  # a mark of another point: step down past it
            if hit is not None:
                x, y = label.xyann
                label.xyann = (x, y - step if boxes[later].y0 <= hit.y0 else y + step)
                moved = True
        if not moved:
            return
