"""The book's figure style: one palette, one size, one look for every chapter's figures."""

from __future__ import annotations

# The book's colours, in the order plots use them: blue, rust, green, violet, ochre, slate.
PALETTE: tuple[str, ...] = ("#1f5f8b", "#c4512d", "#4f8a3c", "#7a4fa0", "#c99a12", "#5c6670")


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
        }
    )
