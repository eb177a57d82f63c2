# %% [markdown]
# # MLA, `qv` and `only_qv`
#
# `flash_attn_with_kvcache` has an argument that ordinary attention does not: `qv`, a second query
# part that is multiplied with the **values**. It exists for DeepSeek's multi-head latent attention
# (MLA). This notebook derives where it comes from, checks that the "absorbed" form with `qv` equals
# MLA computed the long way, explains the default `softmax_scale`, and shows the `only_qv` mode, the
# one case where `q` (and `k_cache`) may be `None`.

# %%
import matplotlib.pyplot as plt
import torch

import attn_ref
import errors

_ = torch.manual_seed(0)

# %% [markdown]
# ## What the extra term computes
#
# Without `qv`, the score of query row $i$ and key $j$ is $s_{ij} = q_i \cdot k_j$. With `qv` it
# gains a second dot product, against the value vector of the same key:
#
# $$s_{ij} = q_i \cdot k_j + qv_i \cdot v_j, \qquad
# \text{out}_i = \sum_j \operatorname{softmax}_j(\text{scale} \cdot s_{ij})\, v_j .$$
#
# Shapes: `q` is `(b, s_q, h, d)`, `qv` is `(b, s_q, h, d_v)`, the caches are `(b, s_k, h_k, d)`
# and `(b, s_k, h_k, d_v)` (in the code `sq`, `sk`, `dv`). MLA uses a single KV head shared by all
# query heads.

# %%
b, sq, h, d, dv, sk = 1, 1, 4, 8, 16, 12
q, qv = torch.randn(b, sq, h, d), torch.randn(b, sq, h, dv)
k_cache, v_cache = torch.randn(b, sk, 1, d), torch.randn(b, sk, 1, dv)
out = attn_ref.flash_attn_with_kvcache(q, k_cache, v_cache, qv=qv)
out.shape

# %% [markdown]
# For one query head, the two parts of the score per key (their sum is what the softmax sees):

# %%
head = 0
qk_part = k_cache[0, :, 0] @ q[0, 0, head]  # (sk,)
qv_part = v_cache[0, :, 0] @ qv[0, 0, head]  # (sk,)
keys = torch.arange(sk)
plt.figure(figsize=(7, 3))
plt.bar(keys - 0.2, qk_part, width=0.4, label="q · k_j")
plt.bar(keys + 0.2, qv_part, width=0.4, label="qv · v_j")
plt.plot(
    keys, qk_part + qv_part, "k_", markersize=14, markeredgewidth=2, label="score s_j (the sum)"
)
plt.axhline(0, color="grey", linewidth=0.5)
plt.xlabel("key j"), plt.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## Where it comes from: MLA, the long way and the absorbed way
#
# MLA stores, per token $j$, a compressed **latent** $c_j \in \mathbb{R}^{d_c}$ and a small rotary
# key $r_j \in \mathbb{R}^{d_r}$, both shared by all heads. Head $h$ rebuilds its key and value with
# up-projections $W^{h}_{UK}, W^{h}_{UV}$:
#
# $$k^h_j = \big[\, W^h_{UK} c_j \;;\; r_j \,\big], \qquad v^h_j = W^h_{UV} c_j ,$$
#
# and its query is $q^h = [\, q^h_{\text{nope}} \;;\; q^h_{\text{rope}} \,]$. The score is
#
# $$q^h \cdot k^h_j = q^h_{\text{nope}} \cdot W^h_{UK} c_j + q^h_{\text{rope}} \cdot r_j
# = \underbrace{\big(W^{h\top}_{UK} q^h_{\text{nope}}\big)}_{qv^h} \cdot\, c_j + q^h_{\text{rope}}
# \cdot r_j .$$
#
# Moving $W_{UK}$ onto the query ("absorbing" it) means the cache never has to be decompressed: the
# **latent cache plays the role of V**, the rotary keys the role of K, and
# $qv^h = W^{h\top}_{UK} q^h_{\text{nope}}$ is exactly the extra query part. The output is a mix of
# latents, $\sum_j p_j c_j$, and $W_{UV}$ is applied afterwards.
#
# Let us check it with small sizes.

# %%
# latent, rotary, no-pe query, per-head value dims
d_c, d_r, d_nope, d_head_v, sk = 16, 8, 12, 10, 20
latent = torch.randn(sk, d_c)  # c_j: what the V cache holds
rope_keys = torch.randn(sk, d_r)  # r_j: what the K cache holds
w_uk, w_uv = torch.randn(h, d_nope, d_c) / d_c**0.5, torch.randn(h, d_head_v, d_c) / d_c**0.5
q_nope, q_rope = torch.randn(h, d_nope), torch.randn(h, d_r)
scale = (d_nope + d_r) ** -0.5  # MLA's scale: the head dim of the *decompressed* query

# %% [markdown]
# The long way: decompress keys and values for every head and run plain attention.

# %%
keys_full = torch.cat(
    [torch.einsum("hnc,sc->shn", w_uk, latent), rope_keys[:, None].expand(sk, h, d_r)], -1
)
values_full = torch.einsum("hvc,sc->shv", w_uv, latent)  # (sk, h, d_head_v)
query_full = torch.cat([q_nope, q_rope], -1)[None]  # (1, h, d_nope + d_r)
mla_long, _ = attn_ref.attention_with_lse(query_full, keys_full, values_full, scale)

# %% [markdown]
# The absorbed way: one call on the compressed cache with `qv`, then the value up-projection.

# %%
qv_absorbed = torch.einsum("hnc,hn->hc", w_uk, q_nope)  # (h, d_c)
latent_mix = attn_ref.flash_attn_with_kvcache(
    q_rope[None, None],
    rope_keys[None, :, None],
    latent[None, :, None],
    qv=qv_absorbed[None, None],
    softmax_scale=scale,
)  # (1, 1, h, d_c)
mla_absorbed = torch.einsum("hvc,hc->hv", w_uv, latent_mix[0, 0])
torch.testing.assert_close(mla_absorbed, mla_long[0])
print("max difference:", (mla_absorbed - mla_long[0]).abs().max().item())

# %% [markdown]
# The cache holds $d_c + d_r$ numbers per token instead of the $h\,(d_{\text{nope}} + d_r + d_v)$ of
# the decompressed keys and values. With DeepSeek-V3's sizes ($d_c = 512$, $d_r = 64$, 128 heads
# with $d_{\text{nope}} = d_v = 128$) that is 576 numbers per token instead of 40,960.
#
# ## The default scale
#
# Note that we passed `softmax_scale` ourselves. When it is left at `None`, the call treats $[q ;
# qv]$ as one long query of $d + d_v$ channels against the long key $[k ; v]$, and uses
#
# | call | default `softmax_scale` |
# |---|---|
# | no `qv` | $1/\sqrt{d}$ |
# | with `qv` | $1/\sqrt{d + d_v}$ |
# | `only_qv=True` | $1/\sqrt{d_v}$ |
#
# The "one long query" view is exact: attention with `qv` equals plain attention on concatenated
# queries and keys, with the values unchanged.

# %%
with_qv = attn_ref.flash_attn_with_kvcache(q, k_cache, v_cache, qv=qv)
long_q = torch.cat([q, qv], dim=-1)  # (b, sq, h, d + dv)
long_k = torch.cat([k_cache, v_cache], dim=-1)  # (b, sk, 1, d + dv)
concatenated, _ = attn_ref.attention_with_lse(long_q[0], long_k[0], v_cache[0], (d + dv) ** -0.5)
torch.testing.assert_close(with_qv[0], concatenated)

# %% [markdown]
# For MLA the right scale is usually *not* the default: DeepSeek scales by the decompressed head dim
# ($1/\sqrt{d_{\text{nope}} + d_r}$, as above), so callers such as sglang pass `softmax_scale`
# explicitly. Leaving it out changes the result:

# %%
default_scale = attn_ref.flash_attn_with_kvcache(
    q_rope[None, None], rope_keys[None, :, None], latent[None, :, None], qv=qv_absorbed[None, None]
)
print(f"MLA scale {scale:.4f}, default scale {(d_r + d_c) ** -0.5:.4f}")
print("max change of the output:", (default_scale - latent_mix).abs().max().item())

# %% [markdown]
# ## `only_qv`: scores from the values alone
#
# Some MLA layers use no rotary part at all ($d_r = 0$, "NoPE"). Then the score is only the latent
# term, and `only_qv=True` computes
#
# $$s_{ij} = qv_i \cdot v_j, \qquad \text{out}_i = \sum_j
# \operatorname{softmax}_j\!\big(s_{ij}/\sqrt{d_v}\big)\, v_j ,$$
#
# skipping $q \cdot k$ entirely. Since neither `q` nor the K cache is read, both may be `None`
# (sglang then makes a placeholder K cache and a dummy `q`).

# %%
only = attn_ref.flash_attn_with_kvcache(None, None, v_cache, qv=qv, only_qv=True)
values = v_cache[0, :, 0]  # (sk, dv)
by_hand = torch.softmax((qv[0, 0] @ values.T) * dv**-0.5, dim=-1) @ values  # (h, dv)
torch.testing.assert_close(only[0, 0], by_hand)

# %% [markdown]
# Whatever is in `q` and `k_cache` is ignored when they are given:

# %%
ignored = attn_ref.flash_attn_with_kvcache(q * 100, k_cache * 100, v_cache, qv=qv, only_qv=True)
assert torch.equal(ignored, only)

# %% [markdown]
# ## Why `q=None` is allowed only with `only_qv`
#
# Without `only_qv`, the score contains $q_i \cdot k_j$, so there is nothing to compute without `q`.
# The checks follow sglang's wrapper, in sglang's order, and each one says what to do. Each cell
# below makes the mistake on purpose, asserts that the expected error happened, and resolves it to
# its entry in the error catalog with `errors.lookup` (tutorial 6 shows what an entry holds).

# %%
try:
    attn_ref.flash_attn_with_kvcache(None, k_cache, v_cache, qv=qv)  # forgot only_qv=True
except ValueError as error:
    assert str(error) == "q can only be None when only_qv=True"
    entry = errors.lookup(error)
    assert entry["slug"] == "only-qv/q-none-without-only-qv"
    print(f"{error}\n  -> catalog entry {entry['id']}: {entry['slug']}")
else:
    raise AssertionError("expected a ValueError")

# %% [markdown]
# `only_qv` without `qv` has no scores at all:

# %%
try:
    attn_ref.flash_attn_with_kvcache(None, None, v_cache, only_qv=True)  # forgot qv
except ValueError as error:
    assert str(error) == "q must be provided unless qv is provided with only_qv=True"
    entry = errors.lookup(error)
    assert entry["slug"] == "only-qv/q-none-and-qv-none"
    print(f"{error}\n  -> catalog entry {entry['id']}: {entry['slug']}")
else:
    raise AssertionError("expected a ValueError")

# %% [markdown]
# and the same mistake with a `q` present is caught while the default scale $1/\sqrt{d_v}$ is being
# worked out (there is no `qv` to take $d_v$ from):

# %%
try:
    attn_ref.flash_attn_with_kvcache(q, k_cache, v_cache, only_qv=True)
except ValueError as error:
    assert str(error) == "only_qv=True requires qv to be provided"
    entry = errors.lookup(error)
    assert entry["slug"] == "only-qv/only-qv-without-qv"
    print(f"{error}\n  -> catalog entry {entry['id']}: {entry['slug']}")
else:
    raise AssertionError("expected a ValueError")

# %% [markdown]
# The fix in all three cases is the call of the previous section: pass `qv`, and set `only_qv=True`
# when `q` is left out.
#
# ## Summary
#
# * `qv` adds $qv_i \cdot v_j$ to every score: MLA's absorbed no-pe term, with the latent cache as
# V.
# * The default scale counts both parts, $1/\sqrt{d + d_v}$; MLA callers pass their own.
# * `only_qv=True` keeps only that term (scale $1/\sqrt{d_v}$); it is the one mode where `q` and
#   `k_cache` may be `None`.
