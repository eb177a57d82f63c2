# %% [markdown]
# # KV-cache decoding from scratch
#
# A language model generates text one token at a time. At every step the new token's query attends
# to the keys and values of **all** earlier tokens. Recomputing those keys and values at each step
# would repeat almost all the work, so inference engines keep them in a **KV cache** and only append
# the new token's key and value.
#
# This notebook builds such a cache step by step with `flash_attn_with_kvcache` (sglang's FA3 API)
# and shows what each of its cache parameters does: `cache_seqlens`, `page_table`, `cache_leftpad`
# and grouped-query heads. At the end the same calls run on the Triton kernels and are compared with
# the reference. Everything runs on a laptop CPU.

# %%
import os

import torch

# where the kernel comparison at the end runs
device = "cuda" if torch.cuda.is_available() else "cpu"
if device == "cpu":
    # run Triton kernels in the interpreter; set before importing them
    os.environ["TRITON_INTERPRET"] = "1"

import matplotlib.pyplot as plt
from matplotlib.colors import ListedColormap

import attn_ref

_ = torch.manual_seed(0)

# %% [markdown]
# ## The answer we expect
#
# Take a toy sequence of 12 tokens whose queries, keys and values are already computed (a real model
# gets them from its projections). Layout: `(seqlen, heads, head_dim)`. Attending all tokens at once
# with a causal mask (`attn_ref.AttentionMask(causal=True)`, the mask object the reference's
# building blocks take) gives, in row $t$, what token $t$ should get from attention:
#
# $$\text{out}_t = \sum_{j \le t} \operatorname{softmax}_j\!\left(\frac{q_t \cdot
# k_j}{\sqrt{d}}\right) v_j .$$

# %%
tokens, h, d = 12, 2, 16
q_all, k_all, v_all = (torch.randn(tokens, h, d) for _ in range(3))
causal = attn_ref.AttentionMask(causal=True)
expected, _ = attn_ref.attention_with_lse(q_all, k_all, v_all, softmax_scale=d**-0.5, mask=causal)
expected.shape

# %% [markdown]
# ## A contiguous cache, filled step by step
#
# The cache has room for `capacity` tokens per sequence: `k_cache` is `(batch, capacity, heads, d)`,
# `v_cache` likewise. One call does two things:
#
# 1. it writes the new keys `k` and values `v` into the cache at positions
#    `cache_seqlens, cache_seqlens + 1, ...` (**in place**), then
# 2. it attends the queries `q` to the cache positions `[0, cache_seqlens + new tokens)`.
#
# `cache_seqlens` is how many tokens the cache held *before* the call. We first hand it the 4 prompt
# tokens at once (a "prefill", causal), then decode the other 8 one at a time.
#
# <div class="admonition warning">
# <p class="admonition-title">The call appends in place, and does not advance
# <code>cache_seqlens</code></p> <p>The new <code>k</code> and <code>v</code> are written
# <strong>into</strong> <code>k_cache</code> and <code>v_cache</code>; <code>cache_seqlens</code> is
# never changed by the call. After each call the caller advances it by the number of new tokens
# (here <code>step</code> passes <code>cache_seqlens=start</code>, the number of tokens appended so
# far). Forget it and the next call overwrites the same slots and attends to a cache one step short.
# Copy the caches first if you still need their old contents.</p> </div>

# %%
capacity, prompt = 16, 4
k_cache, v_cache = torch.zeros(1, capacity, h, d), torch.zeros(1, capacity, h, d)


def step(start, end, k_cache, v_cache, **cache_args):
    """Append tokens [start, end) to the cache and attend them; returns (end - start, h, d)."""
    out = attn_ref.flash_attn_with_kvcache(
        q_all[None, start:end],
        k_cache,
        v_cache,
        k=k_all[None, start:end],
        v=v_all[None, start:end],
        cache_seqlens=start,
        causal=True,
        **cache_args,
    )
    return out[0]


outputs, filled = [step(0, prompt, k_cache, v_cache)], [k_cache[0, :, 0, 0] != 0]
for t in range(prompt, tokens):
    outputs.append(step(t, t + 1, k_cache, v_cache))
    filled.append(k_cache[0, :, 0, 0] != 0)

torch.testing.assert_close(torch.cat(outputs), expected)
print("prefill + 8 decode steps == causal attention over the whole sequence")

# %% [markdown]
# How the cache filled up: one row per call, one column per cache slot.

# %%
rows = []
for i, now in enumerate(filled):
    before = filled[i - 1] if i else torch.zeros(capacity, dtype=torch.bool)
    # 0 empty, 1 held before the call, 2 written by it
    rows.append(now.int() + (now & ~before).int())
plt.figure(figsize=(6, 3))
plt.imshow(
    torch.stack(rows), cmap=ListedColormap(["#eeeeee", "#9ecae1", "#e6550d"]), vmin=0, vmax=2
)
plt.yticks(
    range(len(rows)), ["prefill"] + [f"decode {t}" for t in range(prompt, tokens)], fontsize=7
)
(
    plt.xlabel("cache slot (position)"),
    plt.title("blue: already cached, orange: appended by this call", fontsize=9),
)
plt.show()

# %% [markdown]
# ## `cache_seqlens`: one length per sequence
#
# In a batch, sequences have different lengths, so `cache_seqlens` is a `(batch,)` int32 tensor.
# Positions at or after a sequence's length are simply not read. To prove it we fill them with huge
# numbers: the result does not change.

# %%
b, capacity = 2, 10
k_cache, v_cache = torch.randn(b, capacity, h, d), torch.randn(b, capacity, h, d)
cache_seqlens = torch.tensor([7, 3], dtype=torch.int32)
q = torch.randn(b, 1, h, d)  # one decode query per sequence

out = attn_ref.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens)
for i in range(b):
    k_cache[i, cache_seqlens[i] :], v_cache[i, cache_seqlens[i] :] = 1e4, 1e4
assert torch.equal(
    attn_ref.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens), out
)

# %% [markdown]
# ## `page_table`: a paged cache
#
# Reserving `capacity` slots for every sequence wastes memory when lengths vary. A **paged** cache
# (vLLM's PagedAttention, sglang) cuts memory into pages of `page_size` tokens, shared by all
# sequences: `k_cache` becomes `(num_pages, page_size, heads, d)`, and a `page_table` of shape
# `(b, max_pages)` lists the pages of each sequence in order. Position $p$ of sequence
# $i$ lives at
#
# $$\mathtt{k\_cache}[\,\mathtt{page\_table}[i,\ \lfloor p / \mathtt{page\_size} \rfloor],\ p \bmod
# \mathtt{page\_size}\,].$$
#
# Pages can sit anywhere; here they are handed out in random order.

# %%
page_size, num_pages, pages_per_seq = 4, 10, 4
page_table = torch.randperm(num_pages)[: b * pages_per_seq].view(b, pages_per_seq).int()
k_pages, v_pages = torch.zeros(num_pages, page_size, h, d), torch.zeros(num_pages, page_size, h, d)
page_table

# %% [markdown]
# The same decode loop as before, for sequence 0 of the batch and a page table of one row, gives the
# same answers: paging changes where the tokens are stored, not the attention.

# %%
one_row = page_table[:1]
outputs = [step(0, prompt, k_pages, v_pages, page_table=one_row)]
outputs += [step(t, t + 1, k_pages, v_pages, page_table=one_row) for t in range(prompt, tokens)]
torch.testing.assert_close(torch.cat(outputs), expected)

# %% [markdown]
# Where the 12 tokens ended up: the physical pages of sequence 0 (blue), labelled with the token
# positions they hold; its fourth page is reserved but still empty.
# `attn_ref.paged_to_dense` reassembles the contiguous view of each page-table row.

# %%
plt.figure(figsize=(8, 1.6))
slot_of_page = {page: slot for slot, page in enumerate(one_row[0].tolist())}
for page in range(num_pages):
    slot = slot_of_page.get(page)
    held = (
        range(slot * page_size, min((slot + 1) * page_size, tokens))
        if slot is not None
        else range(0)
    )
    label = (
        f"tokens\n{held.start}-{held.stop - 1}" if held else ("empty" if slot is not None else "")
    )
    plt.gca().add_patch(
        plt.Rectangle((page, 0), 0.95, 1, color="#eeeeee" if slot is None else "#9ecae1")
    )
    plt.text(page + 0.47, 0.5, label, ha="center", va="center", fontsize=8)
plt.xlim(0, num_pages), plt.ylim(0, 1), plt.yticks([])
plt.xticks(
    [p + 0.47 for p in range(num_pages)], [f"page {p}" for p in range(num_pages)], fontsize=7
)
plt.title(f"page_table[0] = {one_row[0].tolist()}", fontsize=9)
plt.show()

dense = attn_ref.paged_to_dense(k_pages, one_row)  # (1, pages_per_seq * page_size, h, d)
torch.testing.assert_close(dense[0, :tokens], k_all)

# %% [markdown]
# ## `cache_leftpad`: prompts padded on the left
#
# Batched prompts are often left-padded to a common length, so that every sequence's *next* token
# lands at the same position. `cache_leftpad[b]` marks where the real tokens of sequence `b` start;
# the keys before it are never visible. Note that `cache_seqlens` stays the **absolute end** of the
# old tokens (padding included), not a count of real tokens.
#
# Sequence 1 below has 3 padding slots (filled with garbage) before its 4 real tokens.

# %%
k_cache, v_cache = torch.randn(b, capacity, h, d), torch.randn(b, capacity, h, d)
k_cache[1, :3], v_cache[1, :3] = 1e4, -1e4  # padding
cache_seqlens = torch.tensor([7, 7], dtype=torch.int32)
cache_leftpad = torch.tensor([0, 3], dtype=torch.int32)
out = attn_ref.flash_attn_with_kvcache(
    q, k_cache, v_cache, cache_seqlens=cache_seqlens, cache_leftpad=cache_leftpad
)

real_tokens_only, _ = attn_ref.attention_with_lse(q[1], k_cache[1, 3:7], v_cache[1, 3:7], d**-0.5)
torch.testing.assert_close(out[1], real_tokens_only)

# %% [markdown]
# Masks count keys from the left pad: with `cache_leftpad`, "key $j$" is the $j$-th *real* key.
#
# ## Grouped-query attention (GQA)
#
# The cache is the largest consumer of memory during decoding. GQA shrinks it by letting groups of
# query heads share one key/value head: with $h$ query heads and $h_k$ KV heads (group size
# $g = h / h_k$), query head `head` reads KV head `head // g`. With 6 query heads and 2 KV heads,
# heads 0, 1, 2 read KV head 0 and heads 3, 4, 5 read KV head 1, and the cache is 3 times smaller.
# (MQA is $h_k = 1$.)

# %%
h, h_k = 6, 2
q = torch.randn(b, 1, h, d)
k_cache, v_cache = torch.randn(b, capacity, h_k, d), torch.randn(b, capacity, h_k, d)
gqa = attn_ref.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens)

# The same thing with every KV head copied for its group: ordinary multi-head attention.
mha = attn_ref.flash_attn_with_kvcache(
    q,
    k_cache.repeat_interleave(h // h_k, dim=2),
    v_cache.repeat_interleave(h // h_k, dim=2),
    cache_seqlens=cache_seqlens,
)
torch.testing.assert_close(gqa, mha)
g = h // h_k  # the group size
print("query head -> KV head:", {head: head // g for head in range(h)})

# %% [markdown]
# ## Everything at once, on the reference and on the Triton kernel
#
# A realistic decode step combines all of it: a paged cache shared by a batch, per-sequence lengths,
# left padding, GQA, and one new token per sequence appended in place.
# `kernels.flash_attn_with_kvcache` takes exactly the same arguments as
# `attn_ref.flash_attn_with_kvcache`; swapping one import for the other is the whole change. Without
# a GPU the kernel runs in Triton's interpreter (set up in the first cell), which is slow, so the
# shapes stay tiny.
#
# Both calls modify their caches, so each gets a fresh copy of the same inputs.

# %%
import kernels


def decode_inputs(dtype):
    """One decode step for a batch of 2: paged GQA cache (page_size=4, 4 query / 2 KV heads),
    lengths 6 and 9, left padding 0 and 2, one new token each. Same numbers at every call."""
    g = torch.Generator().manual_seed(1)
    rand = lambda *shape: torch.randn(*shape, generator=g).to(dtype)
    page_size, h, h_k, d = 4, 4, 2, 16
    tensors = dict(
        q=rand(2, 1, h, d),
        k_cache=rand(8, page_size, h_k, d),
        v_cache=rand(8, page_size, h_k, d),
        k=rand(2, 1, h_k, d),
        v=rand(2, 1, h_k, d),
        page_table=torch.tensor([[5, 1, 7, 0], [2, 6, 3, 4]], dtype=torch.int32),
        cache_seqlens=torch.tensor([6, 9], dtype=torch.int32),
        cache_leftpad=torch.tensor([0, 2], dtype=torch.int32),
    )
    return {name: x.to(device) for name, x in tensors.items()} | dict(
        causal=True, return_softmax_lse=True
    )


ref_args, kernel_args = decode_inputs(torch.float32), decode_inputs(torch.float32)
ref_out, ref_lse, *_ = attn_ref.flash_attn_with_kvcache(**ref_args)
kernel_out, kernel_lse, *_ = kernels.flash_attn_with_kvcache(**kernel_args)

# the same tokens appended, in place
assert torch.equal(kernel_args["k_cache"], ref_args["k_cache"])
assert torch.equal(kernel_args["v_cache"], ref_args["v_cache"])
torch.testing.assert_close(kernel_out, ref_out)
torch.testing.assert_close(kernel_lse, ref_lse)
print("fp32: max |kernel - reference| =", (kernel_out - ref_out).abs().max().item())

# %% [markdown]
# In fp32 the two agree to rounding. In fp16 the question is *how close is close enough*.
# FlashAttention's rule compares both with an fp32 oracle, and measures the kernel's error against
# the error of a plain fp16 computation of the same attention:
#
# $$\max|\text{out}_{\text{kernel}} - \text{out}_{\text{fp32}}| \;\le\;
# 2 \max|\text{out}_{\text{fp16 math}} - \text{out}_{\text{fp32}}| + 10^{-5}.$$
#
# The oracle is the reference on the fp16 inputs (it computes in fp32), and the fp16 baseline is the
# attention written out with fp16 tensors, on the keys each sequence sees.


# %%
def fp16_attention(args):
    """The same decode step computed in fp16 arithmetic, on the cache after the append."""
    dense_k = attn_ref.paged_to_dense(args["k_cache"], args["page_table"])  # (b, capacity, h_k, d)
    dense_v = attn_ref.paged_to_dense(args["v_cache"], args["page_table"])
    q, group, outputs = args["q"], args["q"].shape[2] // dense_k.shape[2], []
    for i in range(q.shape[0]):
        keys = slice(args["cache_leftpad"][i], args["cache_seqlens"][i] + 1)  # + the appended token
        k_i = dense_k[i, keys].repeat_interleave(group, dim=1)  # (s_k, h, d)
        v_i = dense_v[i, keys].repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[i], k_i) * q.shape[-1] ** -0.5  # fp16
        outputs.append(torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v_i))
    return torch.stack(outputs)


ref_args, kernel_args = decode_inputs(torch.float16), decode_inputs(torch.float16)
oracle, *_ = attn_ref.flash_attn_with_kvcache(**ref_args)
kernel_out, *_ = kernels.flash_attn_with_kvcache(**kernel_args)
fp16_error = (fp16_attention(ref_args).float() - oracle.float()).abs().max().item()
kernel_error = (kernel_out.float() - oracle.float()).abs().max().item()
print(f"fp16 math error {fp16_error:.2e}, kernel error {kernel_error:.2e}")
assert kernel_error <= 2 * fp16_error + 1e-5

# %% [markdown]
# Finally, split-KV: with `num_splits=3` the kernel cuts each sequence's keys with the same
# `attn_ref.split_bounds` as the reference, so even the per-split partial states (`out_accum`,
# `lse_accum`) agree. (Tutorial 4 builds this merge by hand.)

# %%
ref_args, kernel_args = decode_inputs(torch.float32), decode_inputs(torch.float32)
_, _, ref_accum, ref_lse_accum = attn_ref.flash_attn_with_kvcache(**ref_args, num_splits=3)
kernel_out, _, kernel_accum, kernel_lse_accum = kernels.flash_attn_with_kvcache(
    **kernel_args, num_splits=3
)
torch.testing.assert_close(kernel_accum, ref_accum)
torch.testing.assert_close(kernel_lse_accum, ref_lse_accum)
torch.testing.assert_close(kernel_out, ref_out)
print("partial states per split:", tuple(kernel_accum.shape), "(num_splits, b, h, s_q, d_v)")

# %% [markdown]
# ## Summary
#
# | Parameter | What it does |
# |---|---|
# | `k`, `v` + `cache_seqlens` | append new tokens at position `cache_seqlens[b]` (in place), then
# attend |
# | `cache_seqlens` | `(batch,)` absolute end of each sequence's cached tokens; later slots are
# ignored |
# | `page_table` | `(batch, pages)`: position $p$ lives in page `page_table[i, p // page_size]`,
# slot `p % page_size` |
# | `cache_leftpad` | `(batch,)` first real position; keys before it are never seen |
# | $h_k < h$ (GQA) | query head `head` reads KV head `head // g`, $g = h / h_k$ |
#
# and `kernels.flash_attn_with_kvcache` is a drop-in replacement for the reference.
