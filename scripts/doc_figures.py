"""Draw the concept diagrams of the docs site into ``docs/figures/*.svg``.

Run ``.venv/bin/python scripts/doc_figures.py [OUT_DIR]`` after changing a figure; the SVGs are
committed, and ``tests/test_docs.py`` checks that they are what this script draws now.
Masks are drawn from :meth:`attn_ref.AttentionMask.visible_keys`, split ranges from
:func:`attn_ref.split_bounds` and the sequences of a packed batch from
:func:`attn_ref.flash_attn.resolve_varlen_call`, so those figures show what the code does.
Output is deterministic (fixed SVG ids, no date), and text stays text (``svg.fonttype = none``).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import torch  # noqa: E402

from attn_ref import AttentionMask, split_bounds  # noqa: E402
from attn_ref.flash_attn import resolve_varlen_call  # noqa: E402

OUT = ROOT / "docs" / "figures"
RANK = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]
EMPTY, PAD, INK, SEEN = "#F1F1F1", "#C9C9C9", "#333333", "#4C72B0"

plt.rcParams.update(
    {
        "svg.fonttype": "none",
        "svg.hashsalt": "attn-ref",
        "font.family": "sans-serif",
        "font.size": 10,
        "text.color": INK,
        "axes.edgecolor": INK,
        "axes.labelcolor": INK,
        "xtick.color": INK,
        "ytick.color": INK,
    }
)


def canvas(width: float, height: float, xlim: tuple[float, float], ylim: tuple[float, float]):
    """A figure with one frameless axis in data units, y growing downwards (rows read top to
    bottom)."""
    fig, ax = plt.subplots(figsize=(width, height))
    ax.set_xlim(*xlim)
    ax.set_ylim(ylim[1], ylim[0])
    ax.set_aspect("equal")
    ax.axis("off")
    return fig, ax


def cell(ax, x, y, color, text="", w=1.0, h=1.0, text_color="white", size=9, hatch=None):
    ax.add_patch(
        Rectangle((x, y), w, h, facecolor=color, edgecolor="white", linewidth=1.2, hatch=hatch)
    )
    if text != "":
        ax.text(
            x + w / 2,
            y + h / 2,
            str(text),
            ha="center",
            va="center",
            color=text_color,
            fontsize=size,
        )


def arrow(ax, start, end, color=INK, style="-|>", rad=0.0, lw=1.2):
    ax.add_patch(
        FancyArrowPatch(
            start,
            end,
            arrowstyle=style,
            mutation_scale=12,
            color=color,
            lw=lw,
            connectionstyle=f"arc3,rad={rad}",
        )
    )


def save(fig, path: Path) -> None:
    fig.savefig(path, format="svg", bbox_inches="tight", pad_inches=0.05, metadata={"Date": None})
    plt.close(fig)


def kv_cache() -> None:
    """Three cache rows: left padding, old tokens, appended tokens, free capacity."""
    capacity = 16
    rows = [
        ("sequence 0: prefill chunk", 0, 4, 3),
        ("sequence 1: decode", 3, 9, 1),
        ("sequence 2: decode", 0, 13, 1),
    ]
    fig, ax = canvas(10, 4.2, (-7.5, capacity + 0.5), (-1.0, 3 * 1.6 + 2.2))
    for p in range(capacity):
        ax.text(p + 0.5, -0.35, str(p), ha="center", fontsize=8, color="#777777")
    ax.text(-7.4, -0.35, "cache position p", fontsize=8, color="#777777")
    for r, (label, leftpad, seqlen, new) in enumerate(rows):
        y = r * 1.6
        ax.text(-7.4, y + 0.5, f"row {r}: {label}", va="center", fontsize=9)
        for p in range(capacity):
            if p < leftpad:
                cell(ax, p, y, PAD, hatch="///")
            elif p < seqlen:
                cell(ax, p, y, RANK[0], "k,v")
            elif p < seqlen + new:
                cell(ax, p, y, RANK[1], "new")
            else:
                cell(ax, p, y, EMPTY)
        arrow(ax, (seqlen, y + 1.45), (seqlen, y + 1.02))
        ax.text(seqlen + 0.1, y + 1.42, f"cache_seqlens = {seqlen}", fontsize=8, va="center")
    legend = [
        (PAD, "///", "left padding (cache_leftpad), never attended"),
        (RANK[0], None, "old tokens"),
        (RANK[1], None, "new k, v: written here, then attended"),
        (EMPTY, None, "free capacity"),
    ]
    for n, (color, hatch, text) in enumerate(legend):
        x, y = -7.4 + (n % 2) * 11.5, 3 * 1.6 + 0.3 + (n // 2) * 0.9
        cell(ax, x, y, color, w=0.6, h=0.6, hatch=hatch)
        ax.text(x + 0.9, y + 0.3, text, va="center", fontsize=8)
    return fig


def paged() -> None:
    """Logical positions of two sequences -> page table -> pages anywhere in one pool."""
    page_size, tables = 4, [[5, 1, 6], [2, 7]]
    lengths = [11, 6]
    fig, ax = canvas(10, 4.4, (-0.5, 26.5), (-1.8, 9.5))
    ax.text(0, -1.2, "logical view (what attention reads)", fontsize=9, weight="bold")
    ax.text(14.2, -1.2, "page_table", fontsize=9, weight="bold")
    ax.text(19, -1.2, "k_cache: (num_pages = 8, page_size = 4, h_k, d)", fontsize=9, weight="bold")
    for s, (table, n) in enumerate(zip(tables, lengths)):
        y = s * 2.2
        ax.text(0, y - 0.2, f"sequence {s}: {n} tokens", fontsize=8)
        for p in range(len(table) * page_size):
            x = p + (p // page_size) * 0.25
            cell(
                ax,
                x,
                y,
                RANK[s] if p < n else EMPTY,
                p if p < n else "",
                text_color="white",
                size=7,
            )
        for i, page in enumerate(table):
            cell(ax, 14.2 + i * 1.1, y, "#FFFFFF", page, text_color=INK)
            ax.add_patch(Rectangle((14.2 + i * 1.1, y), 1, 1, fill=False, edgecolor=INK, lw=0.8))
    for page in range(8):
        y = page * 1.15 - 0.5
        ax.text(23.2, y + 0.5, f"page {page}", va="center", fontsize=8)
        owner = [(s, i) for s, table in enumerate(tables) for i, t in enumerate(table) if t == page]
        for slot in range(page_size):
            if owner:
                s, i = owner[0]
                p = i * page_size + slot
                cell(
                    ax,
                    19 + slot,
                    y,
                    RANK[s] if p < lengths[s] else EMPTY,
                    p if p < lengths[s] else "",
                    size=7,
                )
            else:
                cell(ax, 19 + slot, y, EMPTY)
    for s, table in enumerate(tables):
        for i, page in enumerate(table):
            arrow(
                ax,
                (14.7 + i * 1.1, s * 2.2 + 1.0),
                (19, page * 1.15),
                color=RANK[s],
                rad=-0.15,
                lw=0.9,
            )
    ax.text(
        0,
        5.3,
        "position p of sequence i lives at  k_cache[page_table[i, p // page_size], p % page_size]",
        fontsize=9,
        family="monospace",
    )
    ax.text(
        0,
        6.3,
        "pages can be anywhere, in any order; unused table entries are never read",
        fontsize=8,
        color="#666666",
    )
    return fig


def gqa() -> None:
    """Eight query heads sharing two KV heads (group size 4)."""
    fig, ax = canvas(7, 2.6, (-2.2, 12), (-0.2, 4.6))
    h, h_k = 8, 2
    g = h // h_k
    for head in range(h):
        kv_head = head // g
        x = head * 1.3 + (0.8 if kv_head else 0)
        cell(ax, x, 0, RANK[kv_head], f"q{head}")
        arrow(ax, (x + 0.5, 1.0), (1.95 + kv_head * 5.8, 3.0), color=RANK[kv_head], lw=0.9)
    for kv_head in range(h_k):
        cell(ax, 1.2 + kv_head * 5.8, 3.0, RANK[kv_head], f"k{kv_head}, v{kv_head}", w=1.6)
    ax.text(-2.1, 0.5, f"query heads\nh = {h}", va="center", fontsize=8)
    ax.text(-2.1, 3.5, f"KV heads\nh_k = {h_k}", va="center", fontsize=8)
    ax.text(
        4.6,
        4.4,
        f"query head q[head] reads KV head kv_head = head // g   (g = {g} = h / h_k)",
        ha="center",
        fontsize=9,
        family="monospace",
    )
    return fig


#: (title, seqlen_q, seqlen_k, mask) of each panel
MASK_PANELS = [
    ("causal, s_q = s_k = 6", 6, 6, AttentionMask(causal=True)),
    ("causal, s_q = 2, s_k = 5", 2, 5, AttentionMask(causal=True)),
    ("causal, s_q = 5, s_k = 2", 5, 2, AttentionMask(causal=True)),
    ("window (2, 1), s_q = 4, s_k = 8", 4, 8, AttentionMask(window_size=(2, 1))),
    (
        "causal + window (2, 0), s_q = 4, s_k = 8",
        4,
        8,
        AttentionMask(causal=True, window_size=(2, 0)),
    ),
    ("chunk 3, causal, s_q = 4, s_k = 8", 4, 8, AttentionMask(causal=True, attention_chunk=3)),
]


def masks() -> None:
    """Visibility matrices from AttentionMask.visible_keys, the diagonal i + Δ outlined."""
    row_heights = [
        max(sq for _, sq, *_ in MASK_PANELS[r * 3 : (r + 1) * 3]) + 0.9 for r in range(2)
    ]
    fig, axes = plt.subplots(
        2, 3, figsize=(10, 3.9), gridspec_kw={"height_ratios": row_heights, "hspace": 0.25}
    )
    for n, (ax, (title, sq, sk, mask)) in enumerate(zip(axes.flat, MASK_PANELS)):
        visible = mask.visible_keys(sq, sk)
        ax.set_xlim(0, 8)
        ax.set_ylim(row_heights[n // 3] - 0.9, -0.9)
        ax.set_aspect("equal")
        ax.axis("off")
        ax.set_title(title, fontsize=9)
        for i in range(sq):
            ax.text(-0.2, i + 0.5, f"i={i}", ha="right", va="center", fontsize=7, color="#777777")
            for j in range(sk):
                cell(
                    ax,
                    j,
                    i,
                    SEEN if visible[i, j] else EMPTY,
                    "1" if visible[i, j] else "0",
                    text_color="white" if visible[i, j] else "#999999",
                    size=7,
                )
            diag = i + sk - sq
            if 0 <= diag < sk:
                ax.add_patch(Rectangle((diag, i), 1, 1, fill=False, edgecolor=RANK[1], lw=2))
        for j in range(sk):
            ax.text(j + 0.5, -0.3, f"{j}", ha="center", fontsize=7, color="#777777")
    fig.text(
        0.5,
        0.04,
        "rows: query i;  columns: key j;  orange outline: key i + Δ with Δ = s_k - s_q "
        "(the query's own position, bottom-right aligned)",
        ha="center",
        fontsize=8,
    )
    return fig


def split_kv() -> None:
    """Keys cut by split_bounds into ranges, each gives (o_s, lse_s), merged with ⊕."""
    sk, n = 10, 3
    fig, ax = canvas(8.5, 3.2, (-2.5, 14.5), (-1.2, 5.8))
    ax.text(-2.4, 0.5, "keys of one\nsequence", va="center", fontsize=8)
    for s, (k0, k1) in enumerate(split_bounds(sk, n)):
        for j in range(k0, k1):
            cell(ax, j + s * 0.4, 0, RANK[s], j, size=8)
        mid = (k0 + k1) / 2 + s * 0.4
        ax.text(mid, -0.45, f"split {s}: [{k0}, {k1})", ha="center", fontsize=8)
        arrow(ax, (mid, 1.05), (mid, 2.2), color=RANK[s])
        cell(ax, mid - 1.2, 2.2, RANK[s], f"(o{s}, lse{s})", w=2.4, size=8)
        arrow(ax, (mid, 3.25), (5.3, 4.25), color=RANK[s])
    cell(ax, 4.3, 4.25, INK, "⊕  →  (o, lse)", w=4.0, size=9)
    ax.text(
        11.9,
        2.7,
        "lse = log Σ_s exp(lse_s)\no = Σ_s exp(lse_s − lse) · o_s",
        fontsize=8,
        family="monospace",
        va="center",
    )
    return fig


#: The colours of the varlen figure's sequences (orange outlines each row's own position).
SEQUENCE = [RANK[0], RANK[2], RANK[4]]
#: The packed batch of the varlen figure: three sequences, the second used only in part.
VARLEN_BATCH = dict(
    cu_seqlens_q=[0, 3, 7, 9],
    cu_seqlens_k=[0, 5, 9, 12],
    seqused_q=[3, 3, 2],
    seqused_k=[5, 3, 3],
)


def varlen() -> None:
    """A packed batch: query rows against keys, one bottom-right causal block per sequence.

    The sequences (their rows and keys, ``seqused`` applied) come from
    :func:`attn_ref.flash_attn.resolve_varlen_call` and each block's mask from its
    :meth:`~attn_ref.AttentionMask.visible_keys`, as the reference attends them.
    """
    cu_q, cu_k = VARLEN_BATCH["cu_seqlens_q"], VARLEN_BATCH["cu_seqlens_k"]
    total_q, total_k = cu_q[-1], cu_k[-1]
    lengths_q = [end - start for start, end in zip(cu_q, cu_q[1:])]
    lengths_k = [end - start for start, end in zip(cu_k, cu_k[1:])]
    k = torch.zeros(total_k, 1, 8)
    call = resolve_varlen_call(
        torch.zeros(total_q, 1, 8),
        k,
        k,
        **{name: torch.tensor(value, dtype=torch.int32) for name, value in VARLEN_BATCH.items()},
        max_seqlen_q=max(lengths_q),
        max_seqlen_k=max(lengths_k),
        softmax_scale=None,
        causal=True,
        qv=None,
        q_descale=None,
        k_descale=None,
        v_descale=None,
        window_size=(-1, -1),
        attention_chunk=0,
        softcap=0.0,
        sinks=None,
    )
    fig, ax = canvas(10, 4.6, (-4.2, total_k + 9.8), (-2.4, total_q + 2.4))
    for s, (q0, rows, k0, keys) in enumerate(call.sequences):
        full_rows, full_keys = lengths_q[s], lengths_k[s]
        visible = call.mask.visible_keys(rows, keys)
        for i in range(full_rows):
            for j in range(full_keys):
                used = i < rows and j < keys
                seen = used and bool(visible[i, j])
                color = SEQUENCE[s] if seen else EMPTY if used else PAD
                cell(ax, k0 + j, q0 + i, color, hatch=None if used else "///")
            if i < rows and 0 <= i + keys - rows < keys:  # the row's own position, i + Δ
                ax.add_patch(
                    Rectangle(
                        (k0 + i + keys - rows, q0 + i), 1, 1, fill=False, edgecolor=RANK[1], lw=2
                    )
                )
        ax.add_patch(Rectangle((k0, q0), full_keys, full_rows, fill=False, edgecolor=INK, lw=1))
        used = (
            ""
            if (rows, keys) == (full_rows, full_keys)
            else f"\nseqused_q = {rows} of {full_rows}, seqused_k = {keys} of {full_keys}"
        )
        ax.text(
            total_k + 0.4,
            q0 + full_rows / 2,
            f"sequence {s}: rows [{q0}, {q0 + full_rows}), keys [{k0}, {k0 + full_keys}), "
            f"Δ = {keys - rows}{used}",
            va="center",
            fontsize=8,
        )
    for name, starts, horizontal in (
        ("cu_seqlens_k: offsets into the rows of k, v", VARLEN_BATCH["cu_seqlens_k"], True),
        ("cu_seqlens_q: offsets into the rows of q", VARLEN_BATCH["cu_seqlens_q"], False),
    ):
        for at in starts:
            if horizontal:
                arrow(ax, (at, -1.05), (at, -0.1), lw=0.9)
                ax.text(at, -1.2, str(at), ha="center", fontsize=8)
            else:
                arrow(ax, (-1.05, at), (-0.1, at), lw=0.9)
                ax.text(-1.2, at, str(at), ha="right", va="center", fontsize=8)
        where = (total_k / 2, -1.9) if horizontal else (-2.2, total_q / 2)
        ax.text(
            *where,
            name,
            ha="center",
            va="center",
            fontsize=8,
            weight="bold",
            rotation=0 if horizontal else 90,
        )
    legend = [
        (SEQUENCE[0], None, "visible (one colour per sequence)"),
        (EMPTY, None, "hidden by the causal mask"),
        (PAD, "///", "past seqused: not attended, out = 0, lse = -inf"),
        ("#FFFFFF", None, "another sequence: never attended"),
    ]
    for n, (color, hatch, text) in enumerate(legend):
        x, y = (n // 2) * 11.5, total_q + 0.6 + (n % 2) * 0.9
        cell(ax, x, y, color, w=0.6, h=0.6, hatch=hatch)
        ax.add_patch(Rectangle((x, y), 0.6, 0.6, fill=False, edgecolor="#999999", lw=0.6))
        ax.text(x + 0.9, y + 0.3, text, va="center", fontsize=8)
    ax.text(
        total_k + 0.9,
        -1.2,
        "orange outline: row i sits at key i + Δ,\nΔ = s_k - s_q of its own sequence",
        fontsize=8,
        va="center",
    )
    return fig


def ulysses() -> None:
    """Token x head ownership before and after the Ulysses all-to-all (P = 4)."""
    P, S, H = 4, 8, 4
    fig, ax = canvas(8.5, 3.6, (-1.5, 2 * H + 5), (-1.4, S + 0.4))
    for panel, title in enumerate(
        [
            "before: rank r holds tokens\nblock r, all heads",
            "after all-to-all: rank r holds\nall tokens, heads block r",
        ]
    ):
        x0 = panel * (H + 4.5)
        ax.text(x0 + H / 2, -0.6, title, ha="center", fontsize=8)
        for t in range(S):
            for h in range(H):
                owner = t // (S // P) if panel == 0 else h // (H // P)
                cell(ax, x0 + h, t, RANK[owner], f"r{owner}", size=7)
        for h in range(H):
            ax.text(x0 + h + 0.5, S + 0.35, f"h{h}", ha="center", fontsize=7, color="#777777")
    ax.text(-0.3, S / 2, "tokens", rotation=90, va="center", ha="right", fontsize=8)
    arrow(ax, (H + 0.6, S / 2), (H + 3.9, S / 2))
    ax.text(H + 2.25, S / 2 - 0.5, "all-to-all", ha="center", fontsize=8)
    return fig


def ring_and_zigzag() -> None:
    """Causal work per rank, in chunk pairs (S cut into 2P chunks): plain ring vs zigzag, P = 4."""
    P = 4
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4))
    plain = [[i // 2 if j <= i else None for j in range(2 * P)] for i in range(2 * P)]
    owner = [c if c < P else 2 * P - 1 - c for c in range(2 * P)]
    zig = [[owner[i] if j <= i else None for j in range(2 * P)] for i in range(2 * P)]
    for ax, grid, title in [
        (axes[0], plain, "plain ring: rank r owns chunks 2r and 2r+1"),
        (axes[1], zig, "zigzag: rank r owns chunks r and 2P-1-r"),
    ]:
        n = len(grid)
        ax.set_xlim(-0.2, n)
        ax.set_ylim(n + 1.0, -1.1)
        ax.set_aspect("equal")
        ax.axis("off")
        for i in range(n):
            for j in range(n):
                r = grid[i][j]
                cell(
                    ax, j, i, EMPTY if r is None else RANK[r], "" if r is None else f"r{r}", size=7
                )
        ax.set_title(title, fontsize=9)
        ax.text(n / 2, -0.4, "key chunk", ha="center", fontsize=8)
        ax.text(-0.3, n / 2, "query chunk", rotation=90, va="center", ha="right", fontsize=8)
        work = [sum(row.count(r) for row in grid) for r in range(P)]
        ax.text(
            n / 2,
            n + 0.05,
            "chunk pairs computed: " + ", ".join(f"r{r}: {w}" for r, w in enumerate(work)),
            ha="center",
            va="top",
            fontsize=8,
        )
    return fig


def ring_steps() -> None:
    """The ring, P = 4: ranks pass K/V to r + 1 (left); which rank's block each rank holds at step t
    (right).

    Drawn narrow (about 4.6 in) with 10 pt labels, so that they stay legible on a 420 px screen.
    """
    P = 4
    fig, ax = canvas(4.6, 2.9, (-3.6, P + 0.2), (-1.3, P + 0.6))
    centre, radius = (-2.0, 1.9), 1.15
    spots = [
        (
            centre[0] + radius * math.sin(2 * math.pi * r / P),
            centre[1] - radius * math.cos(2 * math.pi * r / P),
        )
        for r in range(P)
    ]
    for r, (x, y) in enumerate(spots):
        nx, ny = spots[(r + 1) % P]
        arrow(
            ax,
            (x + 0.28 * (nx - x), y + 0.28 * (ny - y)),
            (nx - 0.28 * (nx - x), ny - 0.28 * (ny - y)),
        )
        cell(ax, x - 0.32, y - 0.32, RANK[r], f"r{r}", w=0.64, h=0.64, size=10)
    ax.text(centre[0], -0.85, "send to r+1", ha="center", fontsize=10)
    for t in range(P):
        ax.text(t + 0.5, -0.35, f"t={t}", ha="center", fontsize=10)
        for r in range(P):
            s = (r - t) % P
            cell(ax, t, r, RANK[s], f"kv{s}", size=10)
    for r in range(P):
        ax.text(-0.12, r + 0.5, f"r{r}", ha="right", va="center", fontsize=10)
    ax.text(P / 2, -0.85, "block held at step t", ha="center", fontsize=10)
    ax.text(P / 2, P + 0.35, "kv(r - t) mod P", ha="center", fontsize=10, family="monospace")
    return fig


def usp() -> None:
    """USP with U = 2, R = 2: Ulysses groups are contiguous ranks, ring groups are strided."""
    fig, ax = canvas(5.5, 3.4, (-2.6, 6.6), (-1.6, 4.6))
    for rank in range(4):
        g, u = divmod(rank, 2)
        x, y = u * 3.2, g * 2.4
        cell(ax, x, y, RANK[rank], f"rank {rank}\nseq block {g}\nheads {u}", w=2.2, h=1.5, size=8)
    for g in range(2):
        ax.add_patch(
            Rectangle((-0.2, g * 2.4 - 0.2), 5.8, 1.9, fill=False, edgecolor=INK, lw=1, ls="--")
        )
        ax.text(-0.35, g * 2.4 + 0.75, f"Ulysses\ngroup {g}", ha="right", va="center", fontsize=8)
    for u in range(2):
        arrow(ax, (u * 3.2 + 1.1, 1.55), (u * 3.2 + 1.1, 2.35), style="<|-|>", color=INK)
        ax.text(u * 3.2 + 1.25, 1.95, f"ring {u}", va="center", fontsize=8)
    ax.text(
        2.7, -0.8, "all-to-all inside a row, K/V rotate inside a column", ha="center", fontsize=8
    )
    return fig


def comm_volume() -> None:
    """Elements each rank receives per layer, in units of S·d, for h = 32, h_k = 8.

    Ulysses is drawn only where it is valid, ``h_k % P == 0`` (P <= 8 here); USP keeps ``U = 2``.
    """
    h, h_k = 32, 8
    degrees = [2, 4, 8, 16, 32]
    ulysses_degrees = [p for p in degrees if h_k % p == 0]
    ulysses = [(p - 1) / p / p * (2 * h + 2 * h_k) for p in ulysses_degrees]
    gather = [2 * (p - 1) / p * h_k for p in degrees]
    usp = [
        (2 - 1) / 2 / p * (2 * h + 2 * h_k) + (p // 2 - 1) / (p // 2) * 2 * h_k / 2 for p in degrees
    ]
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    ax.plot(
        ulysses_degrees,
        ulysses,
        "o-",
        color=RANK[0],
        label=f"Ulysses (4 all-to-alls; needs h_k % P = 0: P ≤ {h_k})",
    )
    ax.plot(
        degrees, gather, "s-", color=RANK[1], label="ring = K/V gather (K and V of the other ranks)"
    )
    ax.plot(degrees, usp, "^-", color=RANK[2], label="USP with U = 2, R = P / 2")
    ax.set_xscale("log", base=2)
    ax.set_xticks(degrees, [str(p) for p in degrees])
    ax.set_xlabel("sequence-parallel degree P")
    ax.set_ylabel("received per rank  [S · d elements]")
    ax.set_title("per-layer communication, h = 32 query heads, h_k = 8 KV heads", fontsize=9)
    ax.grid(alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(fontsize=8, frameon=False)
    return fig


#: File name -> function drawing it.
FIGURES = {
    "kv_cache.svg": kv_cache,
    "paged.svg": paged,
    "gqa.svg": gqa,
    "masks.svg": masks,
    "split_kv.svg": split_kv,
    "varlen.svg": varlen,
    "ulysses.svg": ulysses,
    "ring_steps.svg": ring_steps,
    "ring_zigzag.svg": ring_and_zigzag,
    "usp.svg": usp,
    "comm_volume.svg": comm_volume,
}


def draw_all(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, draw in FIGURES.items():
        save(draw(), out_dir / name)


if __name__ == "__main__":
    out_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    draw_all(out_dir)
    print(f"wrote {len(FIGURES)} figures to {out_dir}")
