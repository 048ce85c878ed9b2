"""Draw the explanatory figures for the RLDS -> Trajectory -> Reverb pipeline.

Why these figures exist
-----------------------
Converting an RLDS dataset into TF-Agents ``Trajectory`` items is easy to get
subtly wrong: episodes must be flattened into one stream of steps, steps must
be paired into overlapping (current, next) windows so every transition knows
its successor, the pair that straddles two episodes must still produce a valid
``LAST -> FIRST`` boundary trajectory, and the discount has to be zeroed at the
right place so TD targets never bootstrap through a terminal state.
``docs/contract.md`` explains this in prose; these four figures show it:

* ``flatten_rlds.png``            episodes of nested steps -> one flat stream.
* ``rlds_to_pairs.png``           flat stream + padding -> overlapping pairs.
* ``pairs_to_trajectories.png``   each pair -> one ``Trajectory`` (step types).
* ``rlds_step_to_trajectory.png`` field-by-field mapping and the
                                  ``zero_terminal_discount`` option.

The script only needs matplotlib (Agg backend), touches no network and is
deterministic, so the PNGs can be regenerated at any time::

    python images/rlds/draw_figures.py [--out_dir DIR]

``--out_dir`` defaults to the directory that contains this script.
"""

from __future__ import annotations

import argparse
import os
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

Point = Tuple[float, float]

# ---------------------------------------------------------------------------
# Style: one colour per step type, a neutral colour for padding.
# ---------------------------------------------------------------------------

DPI = 150
INCHES_PER_UNIT = 0.7  # every figure is laid out in abstract "units"

FONT = "DejaVu Sans"
TEXT = "#222222"
MUTED = "#666666"

STEP_COLOURS: Dict[str, Tuple[str, str]] = {
    # step type: (face colour, edge colour)
    "FIRST": ("#cdebd3", "#2e7d32"),
    "MID": ("#cfe0f7", "#1f5fa8"),
    "LAST": ("#fbd9c4", "#c0561b"),
    "PAD": ("#e4e4e4", "#7a7a7a"),
}
BOUNDARY = "#c2185b"  # highlight for the cross-episode pair
CONTAINER_FACE = "#f6f6f6"
CONTAINER_EDGE = "#9a9a9a"
NOTE_FACE = "#fffbe6"
NOTE_EDGE = "#c9a227"

# The running example used by every figure: two 3-step episodes.
EPISODES: List[List[int]] = [[1, 2, 3], [4, 5, 6]]
STEP_TYPE: Dict[object, str] = {1: "FIRST", 2: "MID", 3: "LAST",
                                4: "FIRST", 5: "MID", 6: "LAST", "pad": "PAD"}
PAIRS: List[Tuple[object, object]] = [(1, 2), (2, 3), (3, 4), (4, 5),
                                      (5, 6), (6, "pad")]
BOUNDARY_PAIR = (3, 4)


# ---------------------------------------------------------------------------
# Drawing helpers.
# ---------------------------------------------------------------------------

def new_canvas(width: float, height: float) -> Tuple[Figure, Axes]:
    """Returns a figure whose one axes spans [0, width] x [0, height] units."""
    size = (width * INCHES_PER_UNIT, height * INCHES_PER_UNIT)
    fig = plt.figure(figsize=size, dpi=DPI)
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.set_aspect("equal")
    ax.axis("off")
    return fig, ax


def box(ax: Axes, x: float, y: float, w: float, h: float, *,
        face: str = "white", edge: str = TEXT, lw: float = 1.4,
        linestyle: str = "-", radius: float = 0.12,
        hatch: Optional[str] = None,
        zorder: float = 2) -> FancyBboxPatch:
    """Draws a rounded box with its lower-left corner at (x, y)."""
    patch = FancyBboxPatch((x, y), w, h,
                           boxstyle=f"round,pad=0,rounding_size={radius}",
                           facecolor=face, edgecolor=edge, linewidth=lw,
                           linestyle=linestyle, hatch=hatch, zorder=zorder)
    ax.add_patch(patch)
    return patch


def text(ax: Axes, x: float, y: float, s: str, *, size: float = 11,
         color: str = TEXT, weight: str = "normal", ha: str = "center",
         va: str = "center", style: str = "normal", family: str = FONT,
         rotation: float = 0, zorder: float = 5) -> None:
    """Places text at (x, y) in data units."""
    ax.text(x, y, s, fontsize=size, color=color, fontweight=weight, ha=ha,
            va=va, fontstyle=style, family=family, rotation=rotation,
            zorder=zorder)


def arrow(ax: Axes, start: Point, end: Point, *, color: str = TEXT,
          lw: float = 1.6, rad: float = 0.0, style: str = "-|>",
          mutation: float = 14, linestyle: str = "-",
          shrink: float = 2.0, zorder: float = 3) -> None:
    """Draws an arrow from ``start`` to ``end`` (curved by ``rad``)."""
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style,
                                 mutation_scale=mutation, color=color,
                                 linewidth=lw, linestyle=linestyle,
                                 connectionstyle=f"arc3,rad={rad}",
                                 shrinkA=shrink, shrinkB=shrink,
                                 zorder=zorder))


def step_label(step: object) -> str:
    return "pad" if step == "pad" else f"step {step}"


def step_box(ax: Axes, x: float, y: float, step: object, *, w: float = 1.0,
             h: float = 0.9, show_type: bool = True, size: float = 11) -> None:
    """Draws one RLDS step, coloured by its step type."""
    kind = STEP_TYPE[step]
    face, edge = STEP_COLOURS[kind]
    hatch = "///" if kind == "PAD" else None
    box(ax, x, y, w, h, face=face, edge=edge, lw=1.8, hatch=hatch)
    # Padding is hatched; give its labels a backing so they stay readable.
    backing = (dict(boxstyle="round,pad=0.12", fc=face, ec="none")
                if kind == "PAD" else None)
    if show_type:
        ax.text(x + w / 2, y + h * 0.64, step_label(step), fontsize=size,
                fontweight="bold", color=TEXT, ha="center", va="center",
                family=FONT, zorder=5, bbox=backing)
        sub = "is_first" if kind == "PAD" else kind
        ax.text(x + w / 2, y + h * 0.3, sub, fontsize=size - 2.5,
                fontweight="bold", color=edge, ha="center", va="center",
                family=FONT, zorder=5, bbox=backing)
    else:
        ax.text(x + w / 2, y + h / 2, step_label(step), fontsize=size,
                fontweight="bold", color=TEXT, ha="center", va="center",
                family=FONT, zorder=5, bbox=backing)


def type_chip(ax: Axes, x: float, y: float, kind: str, *, w: float = 1.05,
              h: float = 0.5, size: float = 10) -> None:
    """A small coloured chip that shows a step type name."""
    face, edge = STEP_COLOURS[kind]
    box(ax, x, y, w, h, face=face, edge=edge, lw=1.6, radius=0.1)
    text(ax, x + w / 2, y + h / 2, kind, size=size, weight="bold", color=edge)


def legend(ax: Axes, x: float, y: float, *, pad_label: str = "padding",
           kinds: Sequence[str] = ("FIRST", "MID", "LAST", "PAD"),
           size: float = 10) -> None:
    """A horizontal colour legend starting at (x, y)."""
    labels = {"FIRST": "FIRST", "MID": "MID", "LAST": "LAST", "PAD": pad_label}
    cursor = x
    for kind in kinds:
        face, edge = STEP_COLOURS[kind]
        box(ax, cursor, y - 0.16, 0.32, 0.32, face=face, edge=edge, lw=1.4,
            radius=0.05, hatch="///" if kind == "PAD" else None)
        text(ax, cursor + 0.45, y, labels[kind], size=size, ha="left")
        cursor += 0.45 + 0.115 * len(labels[kind]) * size / 10 + 0.55


def save(fig: Figure, out_dir: str, name: str) -> str:
    path = os.path.join(out_dir, name)
    # Fixed metadata keeps the output byte-for-byte reproducible.
    fig.savefig(path, dpi=DPI, facecolor="white",
                metadata={"Software": None})
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------
# Figure 1: flatten the nested RLDS dataset.
# ---------------------------------------------------------------------------

def draw_flatten_rlds(out_dir: str) -> str:
    W, H = 16.0, 7.4
    fig, ax = new_canvas(W, H)
    text(ax, W / 2, H - 0.45,
         "Flattening RLDS: a dataset of episodes becomes one stream of steps",
         size=15, weight="bold")

    # Left: the nested dataset.
    ox, oy, ow, oh = 0.4, 0.9, 6.6, 5.35
    box(ax, ox, oy, ow, oh, face=CONTAINER_FACE, edge=CONTAINER_EDGE, lw=1.6)
    text(ax, ox + ow / 2, oy + oh - 0.32,
         "RLDS dataset  (dataset of episodes)",
         size=12, weight="bold")

    sw, sh, gap = 1.3, 0.9, 0.25
    for i, steps in enumerate(EPISODES):
        ex, ey, ew, eh = ox + 0.35, oy + 2.65 - i * 2.4, ow - 0.7, 2.05
        box(ax, ex, ey, ew, eh, face="white", edge=TEXT, lw=1.4)
        text(ax, ex + 0.2, ey + eh - 0.3, f"episode {i + 1}", size=11.5,
             weight="bold", ha="left")
        text(ax, ex + ew - 0.2, ey + eh - 0.3, "{'steps': ..., metadata}",
             size=9.5, color=MUTED, ha="right", family="DejaVu Sans Mono")
        # The nested steps dataset.
        nx, ny, nw, nh = ex + 0.25, ey + 0.2, ew - 0.5, 1.3
        box(ax, nx, ny, nw, nh, face=CONTAINER_FACE, edge=CONTAINER_EDGE,
            lw=1.2, linestyle="--", radius=0.08)
        text(ax, nx + 0.12, ny + nh - 0.05, "steps (nested dataset)", size=8.5,
             color=MUTED, ha="left", va="top")
        total = len(steps) * sw + (len(steps) - 1) * gap
        sx = nx + (nw - total) / 2
        for j, step in enumerate(steps):
            step_box(ax, sx + j * (sw + gap), ny + 0.1, step, w=sw, h=0.85)

    # Middle: the flatten arrow.
    arrow(ax, (ox + ow + 0.2, oy + oh / 2), (ox + ow + 1.45, oy + oh / 2),
          lw=3.0, mutation=26)
    text(ax, ox + ow + 0.82, oy + oh / 2 + 0.45, "flatten", size=13,
         weight="bold")
    text(ax, ox + ow + 0.82, oy + oh / 2 - 0.5,
         "concatenate the\nsteps of all\nepisodes, in order",
         size=8.5, color=MUTED)

    # Right: the flat stream of steps.
    rx = ox + ow + 1.65
    rw = W - 0.4 - rx
    ry, rh = oy + oh / 2 - 1.05, 2.1
    box(ax, rx, ry, rw, rh, face=CONTAINER_FACE, edge=CONTAINER_EDGE, lw=1.6)
    text(ax, rx + rw / 2, ry + rh - 0.32, "flat stream of steps", size=12,
         weight="bold")
    fw, fgap = 0.95, 0.17
    total = 6 * fw + 5 * fgap
    fx = rx + (rw - total) / 2
    flat = [s for ep in EPISODES for s in ep]
    for j, step in enumerate(flat):
        step_box(ax, fx + j * (fw + fgap), ry + 0.3, step, w=fw, h=0.95,
                 size=10.5)
    # Mark where the episode boundary now sits inside the flat stream.
    bx = fx + 3 * (fw + fgap) - fgap / 2
    ax.plot([bx, bx], [ry + 0.15, ry + 1.4], color=BOUNDARY, lw=1.6,
            ls=(0, (3, 2)), zorder=4)
    text(ax, bx, ry - 0.3, "episode boundary is only visible\n"
         "through is_first / is_last", size=9, color=BOUNDARY, va="top")

    legend(ax, ox + 0.1, 0.4, kinds=("FIRST", "MID", "LAST"))
    return save(fig, out_dir, "flatten_rlds.png")


# ---------------------------------------------------------------------------
# Figure 2: flat stream + padding -> overlapping pairs.
# ---------------------------------------------------------------------------

def draw_rlds_to_pairs(out_dir: str) -> str:
    W, H = 16.0, 9.9
    fig, ax = new_canvas(W, H)
    text(ax, W / 2, H - 0.45,
         "Overlapping (current, next) pairs: window size 2, shift 1",
         size=15, weight="bold")

    cols: List[object] = [1, 2, 3, 4, 5, 6, "pad"]
    cw, cgap = 1.15, 0.3
    x0 = 3.5
    col_x = [x0 + i * (cw + cgap) for i in range(len(cols))]
    top_y, top_h = H - 2.15, 1.0

    # Top row: the flat stream with the padding step appended.
    text(ax, x0 - 0.25, top_y + top_h / 2, "flat stream\n+ padding", size=11,
         weight="bold", ha="right")
    for x, step in zip(col_x, cols):
        step_box(ax, x, top_y, step, w=cw, h=top_h)
    pad_x = col_x[-1] + cw / 2
    text(ax, pad_x, top_y + top_h + 0.28, "padding (is_first)", size=10,
         weight="bold", color=STEP_COLOURS["PAD"][1])
    text(ax, col_x[-1] + cw + 0.25, top_y + top_h / 2,
         "appended step\n{is_first: True}\nso step 6 gets\na successor",
         size=9, color=MUTED, ha="left", family=FONT)

    # The sliding windows: one staircase row per pair, under its columns.
    row_h, row_gap = 0.72, 0.28
    first_row_y = top_y - 0.75 - row_h
    for k, (cur, nxt) in enumerate(PAIRS):
        y = first_row_y - k * (row_h + row_gap)
        is_boundary = (cur, nxt) == BOUNDARY_PAIR
        xl = col_x[k] - 0.1
        xr = col_x[k + 1] + cw + 0.1
        if is_boundary:
            box(ax, xl - 0.08, y - 0.14, xr - xl + 0.16, row_h + 0.28,
                face="#fde7ef", edge=BOUNDARY, lw=2.2, linestyle="--",
                zorder=1)
        else:
            box(ax, xl, y - 0.06, xr - xl, row_h + 0.12, face=CONTAINER_FACE,
                edge=CONTAINER_EDGE, lw=1.1, zorder=1)
        step_box(ax, col_x[k], y, cur, w=cw, h=row_h, show_type=False,
                 size=10)
        step_box(ax, col_x[k + 1], y, nxt, w=cw, h=row_h, show_type=False,
                 size=10)
        label = f"pair {k + 1}:  ({cur}, {nxt})"
        text(ax, x0 - 0.25, y + row_h / 2, label, size=11, ha="right",
             weight="bold" if is_boundary else "normal",
             color=BOUNDARY if is_boundary else TEXT)
        if is_boundary:
            text(ax, xr + 0.3, y + row_h / 2 + 0.12,
                 "boundary pair: crosses from", size=10.5, color=BOUNDARY,
                 weight="bold", ha="left")
            text(ax, xr + 0.3, y + row_h / 2 - 0.25,
                 "episode 1 (LAST) into episode 2 (FIRST)", size=10.5,
                 color=BOUNDARY, ha="left")

    # Arrow from the stream to the pairs.
    last_row_y = first_row_y - 5 * (row_h + row_gap)
    arrow(ax, (0.75, top_y - 0.05), (0.75, last_row_y),
          lw=2.2, mutation=20, color=MUTED)
    text(ax, 0.5, first_row_y - 1.9, "sliding window: size 2, shift 1",
         size=10, color=MUTED, rotation=90)

    legend(ax, x0, 0.45, pad_label="padding (is_first)")
    text(ax, W - 0.4, 0.45, "7 steps in  ->  6 pairs out", size=10.5,
         color=MUTED, ha="right")
    return save(fig, out_dir, "rlds_to_pairs.png")


# ---------------------------------------------------------------------------
# Figure 3: each pair -> one Trajectory.
# ---------------------------------------------------------------------------

def step_type_of(step: object) -> str:
    """FIRST if is_first, else LAST if is_last, else MID (pad: is_first)."""
    kind = STEP_TYPE[step]
    return "FIRST" if kind == "PAD" else kind


def draw_pairs_to_trajectories(out_dir: str) -> str:
    W, H = 16.0, 10.6
    fig, ax = new_canvas(W, H)
    text(ax, W / 2, H - 0.45,
         "Each (current, next) pair becomes one Trajectory",
         size=15, weight="bold")

    pw, ph = 1.05, 0.72          # step boxes in the pair column
    px = 0.7                      # x of the pair column
    tx = 4.55                     # x of the trajectory column
    tw = 3.95                     # width of a trajectory box
    row_h = 1.08
    y_top = H - 2.05
    text(ax, px + pw + 0.1, y_top + 0.95, "pair (cur, nxt)", size=12,
         weight="bold")
    text(ax, tx + tw / 2, y_top + 0.95,
         "Trajectory:  step_type -> next_step_type",
         size=12, weight="bold")

    for k, (cur, nxt) in enumerate(PAIRS):
        y = y_top - k * row_h
        is_boundary = (cur, nxt) == BOUNDARY_PAIR
        if is_boundary:
            box(ax, px - 0.25, y - 0.17, tx + tw + 1.75 - px, ph + 0.34,
                face="#fde7ef", edge=BOUNDARY, lw=2.0, linestyle="--",
                zorder=1)
        step_box(ax, px, y, cur, w=pw, h=ph, show_type=False, size=10)
        step_box(ax, px + pw + 0.2, y, nxt, w=pw, h=ph, show_type=False,
                 size=10)
        arrow(ax, (px + 2 * pw + 0.35, y + ph / 2), (tx - 0.15, y + ph / 2),
              lw=1.6, color=MUTED)
        # The trajectory: a box with two chips.
        box(ax, tx, y - 0.04, tw, ph + 0.08, face="white", edge=TEXT, lw=1.2)
        text(ax, tx + 0.15, y + ph / 2, f"traj {k + 1}", size=10, ha="left",
             color=MUTED)
        type_chip(ax, tx + 1.05, y + (ph - 0.5) / 2, step_type_of(cur))
        arrow(ax, (tx + 2.12, y + ph / 2), (tx + 2.7, y + ph / 2), lw=1.4,
              mutation=11)
        type_chip(ax, tx + 2.75, y + (ph - 0.5) / 2, step_type_of(nxt))
        if is_boundary:
            text(ax, tx + tw + 0.15, y + ph / 2, "boundary", size=10.5,
                 color=BOUNDARY, weight="bold", ha="left")

    # Right: the mapping rules, as tall as the six rows.
    nx = tx + tw + 1.85
    nw = W - nx - 0.3
    rules = (
        "step_type      from cur\n"
        "next_step_type from nxt\n"
        "  FIRST if is_first,\n"
        "  else LAST if is_last,\n"
        "  else MID\n"
        "\n"
        "observation    cur.observation\n"
        "action         cur.action\n"
        "reward         cur.reward\n"
        "\n"
        "policy_info    policy_info_fn(cur, nxt)\n"
        "               or ()\n"
        "\n"
        "discount       0 if cur.is_last and\n"
        "                    cur.is_terminal\n"
        "               else cur.discount"
    )
    ry = y_top - 5 * row_h - 0.04
    rh = y_top + ph + 0.04 - ry
    box(ax, nx, ry, nw, rh, face=CONTAINER_FACE, edge=CONTAINER_EDGE, lw=1.4)
    text(ax, nx + 0.2, ry + rh - 0.35, "Trajectory fields", size=12,
         weight="bold", ha="left")
    ax.text(nx + 0.2, ry + rh - 0.75, rules, fontsize=10.5, ha="left",
            va="top", family="DejaVu Sans Mono", color=TEXT, linespacing=1.5,
            zorder=5)

    # Bottom: the one-step-episode special case.
    ny, note_h = 0.35, 1.45
    box(ax, 0.35, ny, W - 0.7, note_h, face=NOTE_FACE, edge=NOTE_EDGE, lw=1.4)
    text(ax, 0.6, ny + note_h - 0.35, "Special case: one-step episode",
         size=11.5, weight="bold", ha="left")
    text(ax, 0.6, ny + 0.5,
         "its only step is followed directly by another\n"
         "is_first step (next episode or padding)",
         size=10, ha="left")
    cy = ny + 0.6
    cx = 6.7
    text(ax, cx - 0.15, cy + 0.25, "pair", size=10, color=MUTED, ha="right")
    type_chip(ax, cx, cy, "FIRST")
    text(ax, cx + 1.25, cy + 0.22, ",", size=13, weight="bold")
    type_chip(ax, cx + 1.45, cy, "FIRST")
    arrow(ax, (cx + 2.65, cy + 0.25), (cx + 3.55, cy + 0.25), lw=1.8)
    text(ax, cx + 3.7, cy + 0.25, "Trajectory", size=10, color=MUTED,
         ha="left")
    type_chip(ax, cx + 4.75, cy, "LAST")
    arrow(ax, (cx + 5.85, cy + 0.25), (cx + 6.4, cy + 0.25), lw=1.4,
          mutation=11)
    type_chip(ax, cx + 6.45, cy, "LAST")
    text(ax, cx + 4.75 + 1.35, ny + 0.3, "(not FIRST -> FIRST)", size=9.5,
         color=MUTED, style="italic")

    legend(ax, px - 0.25, ny + note_h + 0.5, pad_label="padding (is_first)")
    return save(fig, out_dir, "pairs_to_trajectories.png")


# ---------------------------------------------------------------------------
# Figure 4: field-by-field mapping + zero_terminal_discount.
# ---------------------------------------------------------------------------

FIELD_H = 0.42    # height of one field row
FIELD_PITCH = 0.5  # vertical distance between stacked field rows


def field_box(ax: Axes, x: float, w: float, title: str,
              rows: Sequence[Tuple[str, str, float]], *, face: str, edge: str,
              dim: Sequence[str] = ()) -> Dict[str, Tuple[Point, Point]]:
    """Draws a titled container of field rows placed at explicit heights.

    ``rows`` holds (key, label, y_centre). Keys listed in ``dim`` are greyed
    out (present in the data, unused by the conversion). Returns
    {key: (left_anchor, right_anchor)} for attaching arrows.
    """
    top = max(y for _, _, y in rows) + FIELD_H / 2 + 0.6
    bottom = min(y for _, _, y in rows) - FIELD_H / 2 - 0.15
    box(ax, x, bottom, w, top - bottom, face=face, edge=edge, lw=1.8)
    text(ax, x + w / 2, top - 0.3, title, size=12, weight="bold")
    anchors: Dict[str, Tuple[Point, Point]] = {}
    for key, label, yc in rows:
        dimmed = key in dim
        box(ax, x + 0.15, yc - FIELD_H / 2, w - 0.3, FIELD_H,
            face="#fafafa" if dimmed else "white",
            edge="#c8c8c8" if dimmed else "#888888", lw=1.0, radius=0.06)
        text(ax, x + 0.3, yc, label, size=10, ha="left",
             family="DejaVu Sans Mono", color="#aaaaaa" if dimmed else TEXT)
        anchors[key] = ((x + 0.15, yc), (x + w - 0.15, yc))
    return anchors


def rule_node(ax: Axes, centre: Point, s: str, color: str,
              size: float = 9.2) -> Tuple[float, float]:
    """A small white label with a coloured border that names a rule.

    Returns the (left, right) x of its border in data units, measured after
    layout, so arrows can attach exactly to its edges.
    """
    t = ax.text(centre[0], centre[1], s, fontsize=size, color=color,
                ha="center", va="center", family=FONT, zorder=6,
                linespacing=1.15,
                bbox=dict(boxstyle="round,pad=0.3", fc="white", ec=color,
                          lw=1.1))
    ax.figure.draw_without_rendering()
    extent = t.get_bbox_patch().get_window_extent()
    (x0, _), (x1, _) = ax.transData.inverted().transform(
        [(extent.x0, extent.y0), (extent.x1, extent.y1)])
    return float(x0), float(x1)


def draw_rlds_step_to_trajectory(out_dir: str) -> str:
    W, H = 16.0, 13.85
    fig, ax = new_canvas(W, H)
    text(ax, W / 2, H - 0.45,
         "One transition: RLDS steps t and t+1  ->  one Trajectory",
         size=15, weight="bold")

    # Row heights. Trajectory rows sit level with the field that fills them,
    # so (almost) every arrow is horizontal and none of them cross.
    top = H - 1.2
    c = [top - 0.8 - i * FIELD_PITCH for i in range(7)]       # step t rows
    t1_top = top - 4.25 - 0.55
    n = [t1_top - 0.8 - i * FIELD_PITCH for i in range(4)]    # step t+1 rows

    lx, lw_ = 0.5, 4.2
    src = field_box(ax, lx, lw_, "RLDS step t  (cur)", [
        ("is_first", "is_first", c[0]), ("is_last", "is_last", c[1]),
        ("observation", "observation  o_t", c[2]),
        ("action", "action       a_t", c[3]),
        ("reward", "reward       r_t", c[4]),
        ("discount", "discount     d_t", c[5]),
        ("is_terminal", "is_terminal", c[6])],
        face=CONTAINER_FACE, edge="#555555")
    nxt = field_box(ax, lx, lw_, "RLDS step t+1  (nxt)", [
        ("is_first", "is_first", n[0]), ("is_last", "is_last", n[1]),
        ("observation", "observation  o_t+1", n[2]),
        ("rest", "action, reward, ...", n[3])],
        face=CONTAINER_FACE, edge="#555555", dim=("observation", "rest"))

    y_step_type = (c[0] + c[1]) / 2
    y_next_type = (n[0] + n[1]) / 2
    y_policy = (c[6] + n[0]) / 2 - 0.1
    rx, rw = 11.3, 4.2
    dst = field_box(ax, rx, rw, "Trajectory", [
        ("step_type", "step_type", y_step_type),
        ("observation", "observation", c[2]),
        ("action", "action", c[3]),
        ("reward", "reward", c[4]),
        ("discount", "discount", (c[5] + c[6]) / 2 + 0.05),
        ("policy_info", "policy_info", y_policy),
        ("next_step_type", "next_step_type", y_next_type)],
        face="#eef3fb", edge="#1f5fa8")
    text(ax, rx + rw / 2, dst["next_step_type"][0][1] - 0.62,
         "(fields grouped by source, not in namedtuple order)", size=8.5,
         color=MUTED, style="italic")

    c_flags, c_data, c_disc, c_next, c_pi = (
        STEP_COLOURS["FIRST"][1], STEP_COLOURS["MID"][1],
        STEP_COLOURS["LAST"][1], "#7b1fa2", "#666666")

    def link(a: Point, b: Point, color: str, ls: object = "-") -> None:
        arrow(ax, a, b, color=color, lw=1.7, linestyle=ls, shrink=3)

    node_x = 7.3

    # step_type <- flags of step t.
    left, right = rule_node(
        ax, (node_x, y_step_type),
        "FIRST if is_first\nelse LAST if is_last\nelse MID", c_flags)
    for key in ("is_first", "is_last"):
        link(src[key][1], (left, y_step_type), c_flags)
    link((right, y_step_type), dst["step_type"][0], c_flags)

    # observation / action / reward copied straight across.
    for key in ("observation", "action", "reward"):
        link(src[key][1], dst[key][0], c_data)

    # discount <- d_t, zeroed when step t is last and terminal.
    y_disc = dst["discount"][0][1]
    left, right = rule_node(ax, (node_x, y_disc),
                            "d_t,  or 0 if\nis_last & is_terminal", c_disc)
    link(src["discount"][1], (left, y_disc), c_disc)
    link(src["is_terminal"][1], (left, y_disc), c_disc, ls=(0, (4, 2)))
    link((right, y_disc), dst["discount"][0], c_disc)

    # policy_info <- optional function of both steps.
    left, right = rule_node(ax, (node_x, y_policy),
                            "policy_info_fn(cur, nxt)\nor ()  if not given",
                            c_pi)
    # From the bottom of the step t box and the title of the step t+1 box.
    for y_from in (c[6] - FIELD_H / 2 - 0.08, n[0] + FIELD_H / 2 + 0.3):
        link((lx + lw_, y_from), (left, y_policy), c_pi, ls=(0, (4, 2)))
    link((right, y_policy), dst["policy_info"][0], c_pi)

    # next_step_type <- flags of step t+1.
    left, right = rule_node(ax, (node_x, y_next_type),
                            "same rule on\nthe flags of t+1", c_next)
    for key in ("is_first", "is_last"):
        link(nxt[key][1], (left, y_next_type), c_next)
    link((right, y_next_type), dst["next_step_type"][0], c_next)

    # --- Bottom panel: zero_terminal_discount -------------------------------
    p_top = n[3] - FIELD_H / 2 - 0.55
    p_bottom = 0.35
    box(ax, 0.35, p_bottom, W - 0.7, p_top - p_bottom, face=NOTE_FACE,
        edge=NOTE_EDGE, lw=1.5)
    text(ax, 0.6, p_top - 0.35, "Option  zero_terminal_discount=True",
         size=12.5, weight="bold", ha="left")
    text(ax, 0.6, p_top - 0.7,
         "The trajectory whose NEXT step is last-and-terminal also gets "
         "discount 0, so its TD target  r_t + gamma * discount_t * V(o_t+1)"
         "\ndoes not bootstrap through the terminal state. Truncated endings "
         "(is_last without is_terminal) keep their discount.",
         size=10, ha="left", va="top")

    # A small table: columns = trajectories built from steps T-2, T-1, T.
    col_x = [8.25, 10.65, 13.05]
    col_w = 2.1
    head_y = p_top - 2.05
    text(ax, 0.6, head_y + 0.27, "discount of the trajectory built from",
         size=10, color=MUTED, ha="left")
    for i, (x, kind, name) in enumerate(zip(col_x, ("MID", "MID", "LAST"),
                                            ("T-2", "T-1", "T"))):
        face, edge = STEP_COLOURS[kind]
        box(ax, x, head_y, col_w, 0.55, face=face, edge=edge, lw=1.6)
        text(ax, x + col_w / 2, head_y + 0.27, f"step {name}  ({kind})",
             size=10, weight="bold")
        if i:
            arrow(ax, (col_x[i - 1] + col_w, head_y + 0.27),
                  (x, head_y + 0.27), lw=1.2, color=MUTED, mutation=10,
                  shrink=1)

    table = [
        ("terminal ending, default", ("d_T-2", "d_T-1", "0"), None),
        ("terminal ending, zero_terminal_discount=True",
         ("d_T-2", "0", "0"), 1),
        ("truncated ending (is_last only), either setting",
         ("d_T-2", "d_T-1", "d_T"), None),
    ]
    for r, (label, values, hi) in enumerate(table):
        y = head_y - 0.7 - r * 0.62
        text(ax, 0.6, y + 0.22, label, size=10.5, ha="left",
             weight="bold" if hi is not None else "normal")
        for i, (x, v) in enumerate(zip(col_x, values)):
            highlight = i == hi
            box(ax, x + 0.35, y, col_w - 0.7, 0.45,
                face="#fde7ef" if highlight else "white",
                edge=BOUNDARY if highlight else "#888888",
                lw=2.0 if highlight else 1.0, radius=0.08)
            text(ax, x + col_w / 2, y + 0.22, v, size=10.5,
                 family="DejaVu Sans Mono",
                 weight="bold" if highlight else "normal",
                 color=BOUNDARY if highlight else TEXT)
    return save(fig, out_dir, "rlds_step_to_trajectory.png")


# ---------------------------------------------------------------------------

FIGURES: List[Callable[[str], str]] = [
    draw_flatten_rlds,
    draw_rlds_to_pairs,
    draw_pairs_to_trajectories,
    draw_rlds_step_to_trajectory,
]


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out_dir",
                        default=os.path.dirname(os.path.abspath(__file__)),
                        help="where to write the PNGs (default: this "
                             "script's directory)")
    args = parser.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    plt.rcParams["hatch.linewidth"] = 0.6
    for draw in FIGURES:
        print(draw(args.out_dir))


if __name__ == "__main__":
    main()
