# %% [markdown]
# # Masks and positions
#
# Attention lets query row $i$ mix the values of the keys it is allowed to see. *Which* keys it sees
# is decided by masks (causal, sliding window, chunks), and *where* each token sits is told to the
# model by rotary position embeddings. This notebook draws the masks as pictures, explains why
# FlashAttention aligns them to the **bottom-right** corner, and checks where
# `flash_attn_with_kvcache` puts the rotary positions of keys and queries.
#
# Everything here runs on a CPU in a few seconds, with the PyTorch reference `attn_ref`.

# %%
import matplotlib.pyplot as plt
import torch

import attn_ref

_ = torch.manual_seed(0)

# %% [markdown]
# ## A picture of a mask
#
# `attn_ref.AttentionMask(causal=..., window_size=..., attention_chunk=...)` is the mask that
# `flash_attn_with_kvcache`'s three mask options ask for, as one object. Its method
# `visible_keys(s_q, s_k)` returns a boolean matrix of shape `(s_q, s_k)`: entry
# $(i, j)$ is `True` when query row $i$ may attend key $j$. A small helper builds that matrix from
# the options, another draws several of them side by side (dark = visible).


# %%
def visible(sq: int, sk: int, **options) -> torch.Tensor:
    """The (s_q, s_k) visibility of the mask that FlashAttention's ``options`` ask for."""
    return attn_ref.AttentionMask(**options).visible_keys(sq, sk)


def show_masks(masks: dict, size: float = 2.6):
    """Draw boolean matrices (rows = query rows i, columns = keys j), one panel per entry."""
    fig, axes = plt.subplots(1, len(masks), figsize=(size * len(masks), size), squeeze=False)
    for ax, (title, mask) in zip(axes[0], masks.items()):
        rows, cols = mask.shape
        ax.imshow(mask.int(), cmap="Blues", vmin=0, vmax=1.3)
        ax.set_xticks(range(cols)), ax.set_yticks(range(rows))
        ax.set_xticks([c - 0.5 for c in range(cols + 1)], minor=True)
        ax.set_yticks([r - 0.5 for r in range(rows + 1)], minor=True)
        ax.grid(which="minor", color="white", linewidth=1.5)
        ax.tick_params(which="both", length=0, labelsize=7)
        ax.set_xlabel("key j"), ax.set_ylabel("query row i"), ax.set_title(title, fontsize=9)
    fig.tight_layout()
    plt.show()


# %% [markdown]
# ## Causal masks, and why they sit bottom-right
#
# With as many queries as keys (a prompt attending to itself), the causal mask is the familiar lower
# triangle: token $i$ sees tokens $0 \dots i$.
#
# During **decoding** the queries are only the *newest* tokens: the cache holds $s_k$ keys and
# the $s_q$ queries are its last $s_q$ tokens. Query row $i$ therefore sits at key
# position $i + \Delta$ with
#
# $$\Delta = \mathrm{seqlen\_k} - \mathrm{seqlen\_q},$$
#
# and the causal rule is $j \le i + \Delta$: the triangle is aligned to the **bottom-right** corner,
# so the last query always sees every key.

# %%
show_masks(
    {
        "causal, sq=sk=6": visible(6, 6, causal=True),
        "causal, sq=2, sk=5": visible(2, 5, causal=True),
        "causal, sq=5, sk=2": visible(5, 2, causal=True),
    }
)

# %% [markdown]
# With more queries than keys ($\Delta < 0$, third panel) the first rows see **no key at all**.
# What should such a row output? A naive softmax over a row of $-\infty$ divides $0$ by $0$:

# %%
scores = torch.full((4,), float("-inf"))
torch.softmax(scores, dim=0)

# %% [markdown]
# FlashAttention defines the answer instead: a row with no visible key outputs **zeros** and its
# log-sum-exp is $-\infty$. The reference does the same:

# %%
q = torch.randn(1, 5, 1, 8)  # (b, s_q, h, d)
k_cache, v_cache = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)  # a cache of 2 keys
out, lse, *_ = attn_ref.flash_attn_with_kvcache(
    q, k_cache, v_cache, causal=True, return_softmax_lse=True
)
print("output rows:\n", out[0, :, 0, :3])
print("lse per row:", lse[0, 0])

# %% [markdown]
# ## Sliding windows
#
# `window_size=(left, right)` keeps, for row $i$, the keys
#
# $$i + \Delta - \text{left} \;\le\; j \;\le\; i + \Delta + \text{right},$$
#
# a band around the (bottom-right) diagonal; $-1$ leaves that side unbounded. `causal=True` forces
# `right = 0`, so `causal=True, window_size=(left, anything)` is a causal sliding window of
# $\text{left} + 1$ keys, the mask of Mistral-style local attention.

# %%
show_masks(
    {
        "window (2, 0)": visible(6, 6, window_size=(2, 0)),
        "window (2, 1)": visible(6, 6, window_size=(2, 1)),
        "causal + window (2, 3)": visible(6, 6, causal=True, window_size=(2, 3)),
        "window (1, 1), sq=3, sk=8": visible(3, 8, window_size=(1, 1)),
    }
)

# %% [markdown]
# The third panel equals the first: causal replaced the right side 3 by 0. And `window_size=(-1, 0)`
# *is* the causal mask. `AttentionMask` applies these rules once, when it is built (as
# FlashAttention normalises its options): it keeps only the two window sides (-1 for an unbounded
# side) and the chunk size, so different spellings of one mask give equal objects.

# %%
causal_window = attn_ref.AttentionMask(causal=True, window_size=(2, 3))
assert causal_window == attn_ref.AttentionMask(window_size=(2, 0))
assert attn_ref.AttentionMask(window_size=(-1, 0)) == attn_ref.AttentionMask(causal=True)
assert torch.equal(causal_window.visible_keys(6, 6), visible(6, 6, window_size=(2, 0)))
causal_window

# %% [markdown]
# ## Chunked attention
#
# Llama-4 style chunked attention cuts the key positions into chunks of $c$ keys
# (`attention_chunk=c`); a query sees only the keys of **its own chunk**. Row $i$ lives at key
# position $p = i + \Delta$, its chunk starts at
#
# $$\text{start} = p - (p \bmod c),$$
#
# and it sees $\text{start} \le j < \text{start} + c$, combined with the causal and window rules.
# The modulo is a *floor* modulo, so a negative $p$ (a row above the diagonal when
# $\mathrm{seqlen\_q} > \mathrm{seqlen\_k}$) lands in a chunk of negative positions and sees
# nothing.

# %%
show_masks(
    {
        "chunk 4, causal": visible(8, 8, causal=True, attention_chunk=4),
        "chunk 4, causal, sq=3, sk=8": visible(3, 8, causal=True, attention_chunk=4),
        "chunk 3 + window (1, 0)": visible(8, 8, window_size=(1, 0), attention_chunk=3),
        "chunk 2, causal, sq=5, sk=2": visible(5, 2, causal=True, attention_chunk=2),
    }
)

# %% [markdown]
# ## The mask inside attention
#
# The mask enters the scores as $-\infty$ before the softmax:
#
# $$\ell_{ij} = \begin{cases} \text{scale}\cdot q_i \cdot k_j & j \text{ visible to } i \\ -\infty &
# \text{otherwise} \end{cases} \qquad \text{out}_i = \sum_j \operatorname{softmax}(\ell_i)_j \, v_j
# .$$
#
# Written out by hand for one head it gives the same numbers as `attention_with_lse`, which takes
# `(seqlen, heads, dim)` tensors and the mask object, and returns the output and the log-sum-exp:

# %%
sq, sk, d = 4, 10, 8
q, k, v = torch.randn(sq, 1, d), torch.randn(sk, 1, d), torch.randn(sk, 1, d)
mask = attn_ref.AttentionMask(causal=True, window_size=(3, 0))
logits = (q[:, 0] @ k[:, 0].T) * d**-0.5
by_hand = (
    torch.softmax(logits.masked_fill(~mask.visible_keys(sq, sk), float("-inf")), dim=-1) @ v[:, 0]
)

out, lse = attn_ref.attention_with_lse(q, k, v, softmax_scale=d**-0.5, mask=mask)
torch.testing.assert_close(out[:, 0], by_hand)
print("max difference:", (out[:, 0] - by_hand).abs().max().item())

# %% [markdown]
# ## Rotary positions
#
# Attention itself does not know the order of the tokens; rotary position embeddings (RoPE) tell it.
# The first `rotary_dim` channels of a query or key at position $p$ are grouped in pairs, and pair
# $m$ is rotated by the angle $p\,\theta_m$ (with $\theta_m = 10000^{-2m/\mathrm{rotary\_dim}}$):
#
# $$\begin{pmatrix} y_1 \\ y_2 \end{pmatrix} =
# \begin{pmatrix} \cos p\theta_m & -\sin p\theta_m \\ \sin p\theta_m & \cos p\theta_m \end{pmatrix}
# \begin{pmatrix} x_1 \\ x_2 \end{pmatrix}.$$
#
# `flash_attn_with_kvcache` takes the tables `rotary_cos[p, m]` $= \cos p\theta_m$ and
# `rotary_sin[p, m]` $= \sin p\theta_m$, of shape `(positions, rotary_dim / 2)`.

# %%
d = rotary_dim = 16
theta = 10000.0 ** (-torch.arange(0, rotary_dim, 2) / rotary_dim)  # (rotary_dim / 2,)
angles = torch.arange(64)[:, None] * theta[None, :]  # (positions, rotary_dim / 2)
rotary_cos, rotary_sin = angles.cos(), angles.sin()

# %% [markdown]
# Rotations compose, so the score of a rotated query at position $p_q$ and a rotated key at $p_k$
# depends only on the **distance** $p_q - p_k$: the curves below, for three different key positions,
# lie on top of each other.


# %%
def rotate(x, position):
    """x: (dim,) at one position -> rotated (dim,), through attn_ref.apply_rotary (GPT-J pairs)."""
    return attn_ref.apply_rotary(
        x[None, None], rotary_cos, rotary_sin, torch.tensor([position]), True
    )[0, 0]


q_vec, k_vec = torch.randn(d), torch.randn(d)
distances = range(0, 30)
plt.figure(figsize=(6, 3))
for key_position, width in ((0, 7), (10, 4), (20, 1.5)):
    scores = [rotate(q_vec, key_position + t) @ rotate(k_vec, key_position) for t in distances]
    plt.plot(distances, scores, linewidth=width, label=f"key at position {key_position}")
plt.xlabel("distance p_q - p_k"), plt.ylabel("score q·k"), plt.legend()
plt.show()

# %% [markdown]
# ### Two ways to pair the channels
#
# * `rotary_interleaved=True` (GPT-J): pairs are channels $(0, 1), (2, 3), \dots$
# * `rotary_interleaved=False` (GPT-NeoX, Llama): pairs are channels $(m, m +
# \mathrm{rotary\_dim}/2)$.
#
# They are the same rotation applied to a different channel order. Reordering the channels as
# "even ones, then odd ones" turns one layout into the other:

# %%
x = torch.randn(3, 2, d)  # (tokens, heads, dim)
positions = torch.tensor([4, 9, 30])
even_then_odd = torch.cat([torch.arange(0, rotary_dim, 2), torch.arange(1, rotary_dim, 2)])
gptj = attn_ref.apply_rotary(x, rotary_cos, rotary_sin, positions, interleaved=True)
neox = attn_ref.apply_rotary(
    x[..., even_then_odd], rotary_cos, rotary_sin, positions, interleaved=False
)
torch.testing.assert_close(gptj[..., even_then_odd], neox)

# %% [markdown]
# ### Where the KV-cache call puts the positions
#
# With `rotary_cos` / `rotary_sin`, `flash_attn_with_kvcache` rotates the **new keys** `k` before
# writing them into the cache: new key $t$ of sequence $b$ sits at position
# `cache_seqlens[b] + t`. The cache stores rotated keys, so old keys are never rotated again.
#
# Below, a cache already holds 5 tokens and we append 3 new ones.

# %%
h, cached, new = 2, 5, 3
# (batch, capacity, heads, dim)
k_cache, v_cache = torch.zeros(1, 16, h, d), torch.zeros(1, 16, h, d)
k_cache[:, :cached], v_cache[:, :cached] = (
    torch.randn(1, cached, h, d),
    torch.randn(1, cached, h, d),
)
k_new, v_new, q = torch.randn(1, new, h, d), torch.randn(1, new, h, d), torch.randn(1, new, h, d)
cache_seqlens = torch.tensor([cached], dtype=torch.int32)

out_causal = attn_ref.flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=k_new,
    v=v_new,
    rotary_cos=rotary_cos,
    rotary_sin=rotary_sin,
    cache_seqlens=cache_seqlens,
    causal=True,
)
new_positions = torch.arange(cached, cached + new)
stored = attn_ref.apply_rotary(k_new[0], rotary_cos, rotary_sin, new_positions, interleaved=True)
torch.testing.assert_close(k_cache[0, cached : cached + new], stored)
print("new keys were written rotated at positions", new_positions.tolist())

# %% [markdown]
# The queries are rotated too, and here the rule depends on the mask:
#
# * **causal or local** (window / chunk): query row $i$ is at position `cache_seqlens + i`, the
#   same positions as the new keys, since the queries *are* those tokens;
# * **no mask**: every query row is at position `cache_seqlens` (FlashAttention's docstring: "we
#   consider all tokens in q to be at position cache_seqlens").
#
# We check both rules by rotating `q` ourselves and attending the updated cache directly. The cache
# already holds the rotated new keys, so this time nothing is appended.

# %%
keys, values = k_cache[0, : cached + new], v_cache[0, : cached + new]
scale = d**-0.5

q_rows_at_own_positions = attn_ref.apply_rotary(q[0], rotary_cos, rotary_sin, new_positions, True)
expected, _ = attn_ref.attention_with_lse(
    q_rows_at_own_positions, keys, values, scale, attn_ref.AttentionMask(causal=True)
)
torch.testing.assert_close(out_causal[0], expected)

out_plain = attn_ref.flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    rotary_cos=rotary_cos,
    rotary_sin=rotary_sin,
    cache_seqlens=cached,
    k=k_new,
    v=v_new,  # rewrites the same rotated keys at the same positions
)
q_rows_at_one_position = attn_ref.apply_rotary(
    q[0], rotary_cos, rotary_sin, torch.full((new,), cached), True
)
expected, _ = attn_ref.attention_with_lse(q_rows_at_one_position, keys, values, scale)
torch.testing.assert_close(out_plain[0], expected)
print(
    "causal: q rows at positions",
    new_positions.tolist(),
    "| no mask: every q row at position",
    cached,
)

# %% [markdown]
# ## Summary
#
# | Option | Key $j$ visible to row $i$ when |
# |---|---|
# | `causal=True` | $j \le i + \Delta$ |
# | `window_size=(l, r)` | $i + \Delta - l \le j \le i + \Delta + r$ (causal forces $r = 0$) |
# | `attention_chunk=c` | $j$ in the chunk of $i + \Delta$: $[\,p - (p \bmod c),\; p - (p \bmod c) +
# c)$ |
#
# with $\Delta = \mathrm{seqlen\_k} - \mathrm{seqlen\_q}$ (bottom-right alignment), all the
# switched-on rules together; `attn_ref.AttentionMask(**options)` is that mask as one normalised
# object. A row that sees nothing outputs 0 with LSE $-\infty$. Rotary rotates new keys at
# `cache_seqlens + t`, and queries at `cache_seqlens + i` (causal/local) or all at `cache_seqlens`
# (no mask).
