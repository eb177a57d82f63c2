# %% [markdown]
# # Flash-decoding: split the keys, merge through the log-sum-exp
#
# When a model *decodes*, each sequence brings one new query row and attends to its whole KV cache,
# often thousands of keys. A GPU kernel that gives one program to each (sequence, KV head) pair then
# has only a handful of programs to run, and most of the GPU idles. **Flash-decoding** (split-KV)
# cuts the key range of each sequence into `num_splits` pieces, attends each piece in its own
# program, and merges the partial results exactly.
#
# This notebook does it by hand with the reference: split (`attn_ref.split_bounds`), compute partial
# states (`attn_ref.attention_with_lse`), merge them (`attn_ref.merge_attention_states`), and check
# that the answer equals attention over all the keys at once. It ends with the case every merge must
# survive: a split in which no key is visible.

# %%
from functools import reduce

import matplotlib.pyplot as plt
import torch

import attn_ref

_ = torch.manual_seed(0)

# %% [markdown]
# ## The attention state
#
# For one query row and a set of keys $K$ with logits $\ell_j = \text{scale}\cdot q\cdot k_j$, the
# **attention state** is the pair
#
# $$\text{lse}_K = \log \sum_{j\in K} e^{\ell_j}, \qquad
# o_K = \sum_{j\in K} e^{\ell_j - \text{lse}_K}\, v_j ,$$
#
# the normalised output over $K$ and the log of its softmax denominator (natural log, as
# FlashAttention returns it). For two disjoint key sets $A$ and $B$ the state of $A \cup B$ follows
# from the two states alone:
#
# $$\text{lse} = \log\!\big(e^{\text{lse}_A} + e^{\text{lse}_B}\big), \qquad
# o = e^{\text{lse}_A - \text{lse}}\, o_A + e^{\text{lse}_B - \text{lse}}\, o_B .$$
#
# The weight $e^{\text{lse}_A - \text{lse}}$ is the share of the softmax mass that lies in $A$. That
# is the whole trick: no split needs to see another split's keys.
#
# ## One decoding step, unsplit
#
# One sequence, one query row, 4 query heads sharing 2 KV heads (GQA), 1,000 keys. A few keys are
# made to match the query strongly, so that the attention is not spread evenly.

# %%
sq, h, h_k, d, sk = 1, 4, 2, 32, 1000
scale = d**-0.5
q = torch.randn(sq, h, d)  # (s_q, h, d)
k, v = torch.randn(sk, h_k, d), torch.randn(sk, h_k, d)  # (s_k, h_k, d)
for key in (120, 130, 610, 880):
    k[key] += 1.5 * q[0, ::2]  # query heads 0 and 2 read KV heads 0 and 1

out, lse = attn_ref.attention_with_lse(q, k, v, scale)  # out (sq, h, d), lse (sq, h)

# %% [markdown]
# ## Split the key range
#
# `split_bounds(s_k, num_splits)` cuts $[0, s_k)$ into consecutive ranges of
# $\lceil s_k / \mathrm{num\_splits} \rceil$ keys. The reference and the Triton kernels use this
# same function, so their partial results can be compared one by one.

# %%
bounds = attn_ref.split_bounds(sk, 4)
bounds

# %% [markdown]
# Each split is ordinary attention over its slice of the keys. `key_offset=` and `seqlen_k=` (the
# whole $s_k$) tell `attention_with_lse` where the slice sits in the whole sequence, so causal,
# window and chunk masks stay correct (they are not used yet). Each returns its state in the layout
# `merge_attention_states` takes: the LSE shaped like the output without its last dimension,
# `(s_q, h)`.

# %%
partials = [  # (o_s (sq, h, d), lse_s (sq, h)) per split
    attn_ref.attention_with_lse(q, k[k0:k1], v[k0:k1], scale, key_offset=k0, seqlen_k=sk)
    for k0, k1 in bounds
]

for (k0, k1), (_, lse_s) in zip(bounds, partials):
    print(f"keys [{k0:4d}, {k1:4d}): lse per head {[round(x, 3) for x in lse_s[0].tolist()]}")

# %% [markdown]
# ## Merge
#
# The merge is associative and commutative, so the partial states fold in any order.


# %%
def merge(a, b):
    return attn_ref.merge_attention_states(*a, *b)


merged_out, merged_lse = reduce(merge, partials)
torch.testing.assert_close(merged_out, out)
torch.testing.assert_close(merged_lse, lse)
print("max |merged - unsplit| output:", (merged_out - out).abs().max().item())

tree = merge(merge(partials[3], partials[1]), merge(partials[0], partials[2]))  # another order
torch.testing.assert_close(tree[0], out)

# %% [markdown]
# The picture: the attention weights of head 0 over all keys, the split boundaries, and each split's
# merge weight $e^{\text{lse}_s - \text{lse}}$. The splits that hold the strongly matching keys get
# most of the weight, and the weights sum to 1.

# %%
head, kv_head = 0, 0  # query head `head` reads KV head head // g, g = h / h_k
weights = [torch.exp(lse_s[0, head] - lse[0, head]).item() for _, lse_s in partials]
probabilities = torch.softmax(scale * (k[:, kv_head] @ q[0, head]), dim=0)

plt.figure(figsize=(8, 3))
plt.plot(probabilities, linewidth=0.8)
for (k0, k1), w in zip(bounds, weights):
    plt.axvline(k0, color="grey", linestyle="--", linewidth=0.8)
    plt.text((k0 + k1) / 2, probabilities.max() * 0.9, f"weight {w:.3f}", ha="center")
plt.xlabel("key j"), plt.ylabel("softmax probability (head 0)")
plt.show()
print("sum of the merge weights:", sum(weights))

# %% [markdown]
# ## The same thing inside `flash_attn_with_kvcache`
#
# `num_splits` asks the KV-cache call for exactly this. With `return_softmax_lse=True` it returns
# `(out, lse, out_accum, lse_accum)`, where the last two are the per-split partial states, shaped
# `(num_splits, b, h, s_q, d_v)` and `(num_splits, b, h, s_q)`, like FA3's: the check below
# transposes them to the state layout `(s_q, h)` of the splits above (see the
# [LSE layouts](../../notation/#lse-layouts)).

# %%
k_cache, v_cache = k[None], v[None]  # (b=1, s_k, h_k, d)
result, result_lse, out_accum, lse_accum = attn_ref.flash_attn_with_kvcache(
    q[None], k_cache, v_cache, num_splits=4, return_softmax_lse=True
)
print("out_accum", tuple(out_accum.shape), "lse_accum", tuple(lse_accum.shape))
for s, (o_s, lse_s) in enumerate(partials):
    torch.testing.assert_close(out_accum[s, 0].transpose(0, 1), o_s)  # (h, sq, d) -> (sq, h, d)
    torch.testing.assert_close(lse_accum[s, 0].T, lse_s)
torch.testing.assert_close(result[0], out)

# %% [markdown]
# Splitting changes nothing but the order of fp32 additions: every split count gives the same answer
# up to rounding.

# %%
for n in (1, 2, 3, 7, 16):
    out_n = attn_ref.flash_attn_with_kvcache(q[None], k_cache, v_cache, num_splits=n)
    print(
        f"num_splits={n:2d}: max difference from unsplit {(out_n[0] - out).abs().max().item():.2e}"
    )

# %% [markdown]
# ## A split that sees nothing
#
# Masks can empty a whole split. Decoding with a sliding window of 100 keys (`window_size=(99, 0)`,
# causal), the query sees keys 900 to 999 only, so the first three of four splits contain **no
# visible key**. `attention_with_lse` takes the mask as one object, `attn_ref.AttentionMask`, built
# from FlashAttention's own options. The empty splits' partial state is the empty state:
#
# $$o = 0, \qquad \text{lse} = \log \textstyle\sum_{\emptyset} = \log 0 = -\infty .$$

# %%
window = attn_ref.AttentionMask(causal=True, window_size=(99, 0))
masked = []
for k0, k1 in bounds:
    o_s, lse_s = attn_ref.attention_with_lse(
        q, k[k0:k1], v[k0:k1], scale, window, key_offset=k0, seqlen_k=sk
    )
    masked.append((o_s, lse_s))
    print(
        f"keys [{k0:4d}, {k1:4d}): lse {[round(x, 3) for x in lse_s[0].tolist()]}, max |o| "
        f"{o_s.abs().max().item():.3f}"
    )

# %% [markdown]
# An empty split must drop out of the merge with weight $e^{-\infty - \text{lse}} = 0$. The formula
# needs care, though: it is computed stably by subtracting $m = \max(\text{lse}_A, \text{lse}_B)$
# first, and when **both** sides are empty that is $-\infty - (-\infty)$, which is NaN:

# %%
empty_lse = torch.tensor(float("-inf"))
m = torch.maximum(empty_lse, empty_lse)
print("naive weight of an empty side when both are empty:", torch.exp(empty_lse - m).item())

# %% [markdown]
# `merge_attention_states` guards that case, so merging empty states gives the empty state again,
# and the final answer is untouched:

# %%
both_empty = merge(masked[0], masked[1])
print(
    "empty ⊕ empty:", "lse", both_empty[1].tolist(), "| max |o|", both_empty[0].abs().max().item()
)

windowed_out, windowed_lse = reduce(merge, masked)
expected, expected_lse = attn_ref.attention_with_lse(q, k, v, scale, window)
torch.testing.assert_close(windowed_out, expected)
torch.testing.assert_close(windowed_lse, expected_lse)
assert not torch.isnan(windowed_out).any()

# %% [markdown]
# Two more places where empty states appear:
#
# * **More splits than keys.** `split_bounds(5, 4)` ends with an empty range; attention over zero
#   keys is the empty state too.
# * **A row that sees nothing at all** (e.g. a causal row above the diagonal). Every split is empty,
#   and the merged result is $o = 0$, $\text{lse} = -\infty$, exactly what FlashAttention returns
#   for such a row.

# %%
print(attn_ref.split_bounds(5, 4))
o_empty, lse_empty = attn_ref.attention_with_lse(q, k[:0], v[:0], scale)
print("zero keys: lse", lse_empty[0].tolist(), "| max |o|", o_empty.abs().max().item())

# %% [markdown]
# ## Summary
#
# * An attention state is $(o, \text{lse})$; disjoint key sets merge with
#   $o = \sum_s e^{\text{lse}_s - \text{lse}} o_s$, $\text{lse} = \log \sum_s e^{\text{lse}_s}$.
# * Split-KV = `split_bounds` + one attention per range (masks of the *whole* sequence, via the key
#   offset) + a merge. The result equals the unsplit one up to fp32 rounding.
# * An empty split is $(0, -\infty)$ and must get weight 0 without producing NaN.
# * The LSE here is a natural log. Libraries that store base-2 LSEs (FlashInfer, the Triton
# tutorial) need $\text{lse}_e = \text{lse}_2 \cdot \ln 2$ before merging with these.
# * The same merge combines the steps of ring attention in sequence parallelism.
