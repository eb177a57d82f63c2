# %% [markdown]
# # Sequence parallelism on one machine
#
# When a sequence is too long for one device (long-context LLMs, video diffusion models with
# hundreds of thousands of tokens), it is cut into shards, one per device ("rank"). Attention is the
# hard part: every query needs **every** key. This notebook runs the schemes that sglang uses, for
# real, on 2 and 4 CPU processes talking through `torch.distributed` (gloo):
#
# * **Ulysses**: an all-to-all turns "my tokens, all heads" into "all tokens, my heads";
# * **ring**: key/value blocks travel around a ring of ranks; partial results merge through the LSE;
# * **zigzag**: the ring with a token order that balances causal work;
# * **K/V gather**: every rank gathers all keys and values;
# * **USP**: Ulysses inside groups, ring across them;
#
# and checks each against single-process attention. Along the way it counts the bytes each rank
# receives and the attention work each rank does.

# %%
import os
import shutil
import sys
import tempfile

import matplotlib.pyplot as plt
import torch

import attn_ref
from attn_ref import sequence_parallel as sp

_ = torch.manual_seed(0)

# %% [markdown]
# ## The problem
#
# One sequence of $S = 64$ tokens, $h = 8$ query heads sharing $h_k = 4$ key/value heads (GQA),
# head dim $d = 16$, plus 8 **text tokens** that every rank holds whole (the prompt of a
# text-to-video model, say). Layout `[b, S, h, d]`. The answer every scheme must
# reproduce is ordinary attention of the whole sequence, computed in this process.

# %%
S, h, h_k, d, T = 64, 8, 4, 16, 8
q, k, v = torch.randn(1, S, h, d), torch.randn(1, S, h_k, d), torch.randn(1, S, h_k, d)
text_q, text_k, text_v = (
    torch.randn(1, T, h, d),
    torch.randn(1, T, h_k, d),
    torch.randn(1, T, h_k, d),
)
scale = d**-0.5

full, _ = attn_ref.attention_with_lse(q[0], k[0], v[0], scale)
full_causal, _ = attn_ref.attention_with_lse(
    q[0], k[0], v[0], scale, attn_ref.AttentionMask(causal=True)
)

# %% [markdown]
# ## What every rank runs
#
# `sp.launch(fn, world_size, args, backend="gloo")` starts `world_size` processes, initialises a
# gloo (CPU) process group in each, calls `fn(*args)` on every rank and returns the list of per-rank
# results. The processes are *spawned*, so `fn` must live in a module they can import, not in a
# notebook cell. The next cell writes that module to a temporary folder. It has three parts:
#
# 1. **A byte counter.** The schemes use three collectives: `all_to_all_single`, `all_gather` and
#    `batch_isend_irecv`. Wrapped, each adds the bytes this rank *receives from other ranks*.
# 2. **A work counter.** The schemes take the local attention as a parameter (an
#    `AttentionBackend`). This one counts the (query, key, head) triples it computes, then calls the
#    reference.
# 3. **The worker.** Each rank takes its shard of the full tensors and runs every scheme on it.

# %%
workers_dir = os.path.join(tempfile.gettempdir(), "attn_ref_sp_tutorial")
shutil.rmtree(workers_dir, ignore_errors=True)  # start from an empty folder
os.makedirs(workers_dir)
sys.path.insert(0, workers_dir)  # spawned ranks inherit sys.path, so they find the module too

# %%
# %%writefile {workers_dir}/sp_tutorial_workers.py
"""Per-rank code of the sequence-parallel tutorial."""
import torch.distributed as dist

import attn_ref
from attn_ref import sequence_parallel as sp  # noqa: F811 (this cell is the workers' module)

counters = {"received_bytes": 0, "attended": 0}
collectives = {
    name: getattr(dist, name) for name in ("all_to_all_single", "all_gather", "batch_isend_irecv")
}


def nbytes(x):
    return x.numel() * x.element_size()


def counted_all_to_all_single(output, input, output_split_sizes, input_split_sizes, group=None):
    own_rows = output_split_sizes[dist.get_rank(group)]  # the block this rank sends to itself
    counters["received_bytes"] += nbytes(output) - own_rows * nbytes(output[0])
    return collectives["all_to_all_single"](
        output, input, output_split_sizes, input_split_sizes, group=group
    )


def counted_all_gather(parts, x, group=None):
    counters["received_bytes"] += (len(parts) - 1) * nbytes(x)
    return collectives["all_gather"](parts, x, group=group)


def counted_batch_isend_irecv(ops):
    counters["received_bytes"] += sum(nbytes(op.tensor) for op in ops if op.op is dist.irecv)
    return collectives["batch_isend_irecv"](ops)


def counted_attention(
    q, k_cache, v_cache, *, causal=False, window_size=(-1, -1), attention_chunk=0, **kwargs
):
    mask = attn_ref.AttentionMask(causal, window_size, attention_chunk)
    visible = mask.visible_keys(q.shape[1], k_cache.shape[1]).sum().item()
    counters["attended"] += q.shape[0] * q.shape[2] * visible
    return attn_ref.flash_attn_with_kvcache(q, k_cache, v_cache, **mask.options(), **kwargs)


COUNTING = sp.AttentionBackend("counting", counted_attention, attn_ref.merge_attention_states)


def measure(run):
    """(result of run(), bytes received from other ranks, attention triples computed)."""
    counters["received_bytes"] = counters["attended"] = 0
    result = run()
    return result, counters["received_bytes"], counters["attended"]


def all_schemes(q, k, v, text_q, text_k, text_v):
    """{scheme: (this rank's output rows, bytes received, attention work)} for the full tensors
    q [1, S, h, d], k, v [1, S, h_k, d]; K/V gather adds the output of the text tokens."""
    dist.all_to_all_single, dist.all_gather = counted_all_to_all_single, counted_all_gather
    dist.batch_isend_irecv = counted_batch_isend_irecv
    P, rank, (h, d, h_k) = (
        dist.get_world_size(),
        dist.get_rank(),
        (q.shape[2], q.shape[3], k.shape[2]),
    )

    def shard(ulysses_degree=1, zigzag=False):  # this rank's rows of q, k and v
        return [
            sp.shard_sequence(x, rank, ulysses_degree, P // ulysses_degree, zigzag)
            for x in (q, k, v)
        ]

    all_ranks = sp.init_sequence_parallel_groups(ulysses_degree=P)  # one Ulysses group of P ranks
    ring = sp.init_sequence_parallel_groups(ulysses_degree=1, ring_degree=P).ring_group
    usp_groups = sp.init_sequence_parallel_groups(ulysses_degree=2, ring_degree=P // 2)
    ulysses = sp.UlyssesAttention(h, d, h_k, groups=all_ranks)
    kv_gather = sp.UlyssesAttention(h, d, h_k, sp_attention_mode="kv_gather", groups=all_ranks)
    usp = sp.USPAttention(h, d, h_k, causal=True, groups=usp_groups, zigzag=True)
    ulysses.backend = kv_gather.backend = usp.backend = COUNTING
    (gather_out, text_out), gather_bytes, gather_work = measure(
        lambda: kv_gather(*shard(), text_q, text_k, text_v)
    )
    return {
        "Ulysses": measure(lambda: ulysses(*shard(ulysses_degree=P))[0]),
        "ring": measure(lambda: sp.ring_attention(*shard(), group=ring, backend=COUNTING)[0]),
        "causal ring": measure(
            lambda: sp.ring_attention(*shard(), group=ring, causal=True, backend=COUNTING)[0]
        ),
        "causal zigzag ring": measure(
            lambda: sp.ring_attention(
                *shard(zigzag=True), group=ring, causal=True, zigzag=True, backend=COUNTING
            )[0]
        ),
        "K/V gather + text": (gather_out, gather_bytes, gather_work, text_out),
        "causal USP, U=2": measure(lambda: usp(*shard(ulysses_degree=2, zigzag=True))),
    }


# %% [markdown]
# ## Launch 2 and 4 ranks
#
# Starting the processes takes a few seconds (each one imports torch), so one launch per world size
# runs every scheme.

# %%
import sp_tutorial_workers

args = (q, k, v, text_q, text_k, text_v)
results = {P: sp.launch(sp_tutorial_workers.all_schemes, P, args, backend="gloo") for P in (2, 4)}
for P, per_rank in results.items():
    print(f"{P} ranks ran: {' | '.join(per_rank[0])}")

# %% [markdown]
# ## Every scheme equals single-process attention
#
# `sp.unshard_sequence` puts the per-rank output shards back in sequence order (it knows the
# contiguous and zigzag layouts).


# %%
def gathered(P, scheme, ulysses_degree=1, zigzag=False):
    shards = [rank_results[scheme][0] for rank_results in results[P]]
    return sp.unshard_sequence(shards, ulysses_degree, P // ulysses_degree, zigzag)[0]


for P in (2, 4):
    torch.testing.assert_close(gathered(P, "Ulysses", ulysses_degree=P), full)
    torch.testing.assert_close(gathered(P, "ring"), full)
    torch.testing.assert_close(gathered(P, "causal ring"), full_causal)
    torch.testing.assert_close(gathered(P, "causal zigzag ring", zigzag=True), full_causal)
    torch.testing.assert_close(
        gathered(P, "causal USP, U=2", ulysses_degree=2, zigzag=True), full_causal
    )
print("Ulysses, ring, zigzag ring and USP on 2 and 4 ranks == single-process attention")

# %% [markdown]
# ### How Ulysses can be exact
#
# Attention never mixes heads: the output of a query head depends only on that head of the
# queries (and its KV head) over all tokens. After the all-to-all, rank $r$ holds **all** $S$
# tokens of heads $[rh/P, (r+1)h/P)$, runs plain attention on them, and a second all-to-all sends
# each token's output back to the rank that owns the token. Nothing is approximated; data only
# moves.
#
# ### How the ring can be exact
#
# At step $t$ rank $r$ holds the key/value block of rank $(r - t) \bmod P$. It attends its queries
# to that block and folds the result into a running state with the merge of tutorial 4:
#
# $$\text{lse} = \log\!\big(e^{\text{lse}_{\text{acc}}} + e^{\text{lse}_{\text{blk}}}\big), \qquad
# o = e^{\text{lse}_{\text{acc}} - \text{lse}}\, o_{\text{acc}} + e^{\text{lse}_{\text{blk}} -
# \text{lse}}\, o_{\text{blk}} .$$
#
# After $P$ steps every query has met every key exactly once.
#
# ## Ulysses by hand
#
# The Ulysses exchange is one `torch.distributed.all_to_all_single` per tensor. That call takes a
# flat send buffer on every rank, cuts it along dim 0 into $P$ blocks, sends block $j$ to rank $j$,
# and fills each rank's receive buffer with the blocks it got, in rank order. Everything else is
# the layout of the two buffers, which `_exchange_4d` in `attn_ref/sequence_parallel/comm.py`
# builds (on the [side-by-side page](../../side-by-side/sequence-parallel/#ulysses)). Here the $P$
# ranks are a list again, and `all_to_all_single` is three lines on plain tensors:
#
# * **sequence to heads**, before attention: rank $r$ holds `[b, S / P, h, d]`; its send buffer
#   is `[P, S / P, b, h / P, d]` (block $j$: head block $j$ of its tokens), and what it receives,
#   `[S, b, h / P, d]`, is every rank's tokens of head block $r$;
# * each rank attends all $S$ tokens with its $h / P$ query heads and $h_k / P$ KV heads (query
#   head `head` still reads KV head `head // g`, since $g = h / h_k$ is unchanged);
# * **heads to sequence**, after attention: the inverse exchange; block $i$ of the receive buffer
#   came from rank $i$ and is head block $i$ of this rank's tokens.

# %%
P = 4
shard = S // P  # tokens per rank, S / P


def all_to_all_single(send_buffers):
    """torch.distributed.all_to_all_single on P simulated ranks, equal splits: block j of rank
    i's buffer (dim 0 cut into P blocks) lands as block i of rank j's receive buffer."""
    blocks = [buffer.chunk(P) for buffer in send_buffers]
    return [torch.cat([blocks[i][j] for i in range(P)]) for j in range(P)]


def sequence_to_heads(shards):
    """[b, S / P, heads, d] on every rank -> [b, S, heads / P, d]: scatter heads, gather tokens."""
    sends = []
    for x in shards:
        b, s, heads, dim = x.shape
        # [b, S / P, P, heads / P, d] -> [P, S / P, b, heads / P, d]: block j for rank j
        send = x.reshape(b, s, P, heads // P, dim).permute(2, 1, 0, 3, 4).contiguous()
        sends.append(send.reshape(P * s, b, heads // P, dim))
    return [received.permute(1, 0, 2, 3) for received in all_to_all_single(sends)]  # [b, S, ., d]


def heads_to_sequence(per_head_block):
    """[b, S, h / P, d] on every rank -> [b, S / P, h, d]: the inverse exchange."""
    sends = [x.permute(1, 0, 2, 3).contiguous() for x in per_head_block]  # [S, b, h / P, d]
    shards = []
    for received in all_to_all_single(sends):  # [P * S / P, b, h / P, d]: block i from rank i
        tokens, b, heads, dim = received.shape
        blocks = received.reshape(P, tokens // P, b, heads, dim)
        # [b, S / P, P, h / P, d] -> [b, S / P, h, d]: head block i came from rank i
        shards.append(blocks.permute(2, 1, 0, 3, 4).reshape(b, tokens // P, P * heads, dim))
    return shards


q_shards, k_shards, v_shards = (
    [x[:, r * shard : (r + 1) * shard] for r in range(P)] for x in (q, k, v)
)
q_heads, k_heads, v_heads = (sequence_to_heads(x) for x in (q_shards, k_shards, v_shards))
print("rank 0: q", tuple(q_shards[0].shape), "-> after the all-to-all", tuple(q_heads[0].shape))
print("        k", tuple(k_shards[0].shape), "-> after the all-to-all", tuple(k_heads[0].shape))
out_heads = [
    attn_ref.attention_with_lse(q_r[0], k_r[0], v_r[0], scale)[0][None]  # [1, S, h / P, d]
    for q_r, k_r, v_r in zip(q_heads, k_heads, v_heads)
]
out_shards = heads_to_sequence(out_heads)
torch.testing.assert_close(torch.cat(out_shards, dim=1)[0], full)  # dense attention, all S tokens
for r in range(P):  # and the package's UlyssesAttention, run on 4 processes above
    torch.testing.assert_close(out_shards[r], results[P][r]["Ulysses"][0])
print("4 simulated ranks, two all-to-alls == dense attention == sp.UlyssesAttention")

# %% [markdown]
# ## The ring by hand
#
# The ring's loop fits in a few lines, so we can run it on this one process with the ranks simulated
# as a list: `held[r]` is the K/V block rank `r` holds now, and the exchange is a rotation of that
# list (rank `r` receives what rank `r - 1` held). Each rank keeps one running state `(out, lse)`,
# starting from the empty state `(0, -inf)`, the identity of the merge. With a causal mask, a rank
# skips a block that comes after its queries, attends its own block with a causal square, and an
# earlier block in full: the table of the [ring concept
# section](../../concepts/sequence-parallel/#ring-attention-rotate-kv-blocks). This is the loop of
# `_ring_forward` in `attn_ref/sequence_parallel/ring.py`, without the processes.

# %%
# rank r's block: (S/P, h, d)
q_blocks, k_blocks, v_blocks = (x[0].split(shard) for x in (q, k, v))
held = list(zip(k_blocks, v_blocks))  # step 0: every rank holds its own K/V block
states = [(torch.zeros(shard, h, d), torch.full((shard, h), float("-inf"))) for _ in range(P)]
schedule = []
for t in range(P):
    schedule.append([(r - t) % P for r in range(P)])  # whose block each rank holds at step t
    for r in range(P):
        source = (r - t) % P
        if source > r:
            continue  # causal: a later block is invisible
        k_blk, v_blk = held[r]
        mask = attn_ref.AttentionMask(causal=source == r)  # the causal square on the diagonal
        # (S/P, h, d), (S/P, h)
        block_state = attn_ref.attention_with_lse(q_blocks[r], k_blk, v_blk, scale, mask)
        states[r] = attn_ref.merge_attention_states(*states[r], *block_state)
    held = [held[(r - 1) % P] for r in range(P)]  # the exchange: send to r + 1, receive from r - 1

for t, sources in enumerate(schedule):
    print(f"step {t}: ranks 0, 1, 2, 3 hold the K/V blocks of ranks", sources)
ring_out = torch.cat([out for out, _ in states])
torch.testing.assert_close(ring_out, full_causal)  # one dense causal attention over all S tokens
print("4 simulated ranks, 4 steps, merged with the LSE == dense causal attention")

# %% [markdown]
# ## Replicated tokens are counted once
#
# The 8 text tokens sit on every rank. The K/V-gather run gathers only the *sharded* keys, then
# appends the local copy of the text keys, so the sequence the queries see is
# `[shard 0, ..., shard P-1, text]`, with each text key present once. The text queries are computed
# on every rank (each rank gets the same, whole, text output).

# %%
all_q, all_k, all_v = (
    torch.cat(pair, dim=1)[0] for pair in ((q, text_q), (k, text_k), (v, text_v))
)
expected, _ = attn_ref.attention_with_lse(all_q, all_k, all_v, scale)  # (S + T, h, d)

for P in (2, 4):
    torch.testing.assert_close(gathered(P, "K/V gather + text"), expected[:S])
    for rank_results in results[P]:
        text_out = rank_results["K/V gather + text"][3]
        torch.testing.assert_close(text_out[0], expected[S:])

# %% [markdown]
# Had each rank appended its text keys *before* the gather, every text key would appear $P$ times,
# and its softmax weight would be $P e^{\ell} / (\sum_{\text{other}} + P e^{\ell})$ instead of
# $e^{\ell} / (\sum_{\text{other}} + e^{\ell})$. The damage, for 4 ranks:

# %%
P = 4
duplicated_k = torch.cat([k[0]] + [text_k[0]] * P)
duplicated_v = torch.cat([v[0]] + [text_v[0]] * P)
wrong, _ = attn_ref.attention_with_lse(all_q, duplicated_k, duplicated_v, scale)
print("max |duplicated text - correct|:", (wrong - expected).abs().max().item())

# %% [markdown]
# ## Causal work: contiguous ring versus zigzag
#
# With a causal mask, a key block that comes *after* a rank's queries is invisible and skipped.
# With contiguous shards, rank 0 (the first tokens) computes only the causal half of its own block,
# while the last rank computes $P - 1$ full blocks and that half: about $2P - 1$ times the work of
# rank 0, and everybody waits for it. **Zigzag** cuts the sequence into $2P$ chunks and gives rank
# $r$ chunks $r$ and $2P-1-r$, one early and one late, so every rank does the same work.

# %%
P = 4
print(
    "zigzag token order of rank 0:",
    sp.shard_positions(16, 0, ring_degree=P, zigzag=True).tolist(),
    "(S = 16)",
)
contiguous = [rank_results["causal ring"][2] for rank_results in results[P]]
zigzag = [rank_results["causal zigzag ring"][2] for rank_results in results[P]]

ranks = torch.arange(P)
plt.figure(figsize=(6, 3))
plt.bar(ranks - 0.2, contiguous, width=0.4, label="contiguous shards")
plt.bar(ranks + 0.2, zigzag, width=0.4, label="zigzag shards")
plt.xticks(ranks.tolist(), [f"rank {r}" for r in range(P)])
plt.ylabel("(query, key, head) triples"), plt.title("causal ring attention, 4 ranks", fontsize=9)
plt.legend(fontsize=8)
plt.show()
assert len(set(zigzag)) == 1 and sum(zigzag) == sum(contiguous)

# %% [markdown]
# ## Communication volume
#
# Per rank and per attention layer, with $P$ ranks, $S$ tokens, $e$ bytes per number (4 for
# float32):
#
# | Scheme | Bytes received by each rank |
# |---|---|
# | Ulysses | $\frac{P-1}{P} \cdot \frac{S}{P} \cdot (2h + 2h_k) \cdot d \cdot e$ (all-to-alls of q,
# k, v and the output) |
# | ring (any order) | $(P-1) \cdot \frac{S}{P} \cdot 2 h_k \cdot d \cdot e$ ($P-1$ hops of the
# local K and V) |
# | K/V gather | the same bytes as the ring, in one all-gather (and all of K/V in memory at once) |
# | USP, $P = U \cdot R$ | Ulysses among $U$ ranks on $S/P$ tokens + a ring of $R$ over blocks of
# $S/R$ tokens with $h_k/U$ heads |
#
# The counted bytes match the formulas exactly:


# %%
def ulysses_bytes(P, S, h, h_k, d, e=4):
    return (P - 1) / P * (S / P) * (2 * h + 2 * h_k) * d * e


def ring_bytes(P, S, h_k, d, e=4):
    return (P - 1) * (S / P) * 2 * h_k * d * e


def usp_bytes(U, R, S, h, h_k, d, e=4):
    return ulysses_bytes(U, S / R, h, h_k, d, e) + ring_bytes(R, S, h_k / U, d, e)


print(f"{'scheme':22s}" + "".join(f"{f'P={P} counted':>14s}{'formula':>10s}" for P in (2, 4)))
for scheme in results[4][0]:
    counted = {P: results[P][0][scheme][1] for P in (2, 4)}
    assert all(rank_results[scheme][1] == counted[P] for P in (2, 4) for rank_results in results[P])
    formula = {
        P: ulysses_bytes(P, S, h, h_k, d)
        if scheme == "Ulysses"
        else usp_bytes(2, P // 2, S, h, h_k, d)
        if "USP" in scheme
        else ring_bytes(P, S, h_k, d)
        for P in (2, 4)
    }
    assert all(counted[P] == formula[P] for P in (2, 4))
    print(f"{scheme:22s}" + "".join(f"{counted[P]:14,d}{formula[P]:10,.0f}" for P in (2, 4)))

# %% [markdown]
# Which scheme moves fewer bytes depends on $P$ and on how many query heads share a KV head,
# $\rho = h / h_k$. The ratio is
#
# $$\frac{\text{K/V gather (or ring)}}{\text{Ulysses}} = \frac{P \cdot h_k}{h + h_k} = \frac{P}{\rho
# + 1}.$$
#
# Ulysses' bytes per rank *shrink* as $P$ grows, while the ring's and the gather's grow towards a
# constant, $2 S h_k d e$. With strong GQA ($\rho = 8$) the gather is cheaper for every $P < 9$.
# Ulysses also needs $h_k$ divisible by $P$, which K/V gather and the ring do not.

# %%
Ps = torch.arange(2, 17)
fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
for rho, style in ((1, "-"), (2, "--"), (8, ":")):
    kv_heads = h / rho
    axes[0].plot(
        Ps,
        [ulysses_bytes(p, S, h, kv_heads, d) / 1024 for p in Ps.tolist()],
        "C0" + style,
        label=f"Ulysses, ρ={rho}",
    )
    axes[0].plot(
        Ps,
        [ring_bytes(p, S, kv_heads, d) / 1024 for p in Ps.tolist()],
        "C1" + style,
        label=f"ring / K/V gather, ρ={rho}",
    )
    axes[1].plot(Ps, Ps / (rho + 1), "k" + style, label=f"ρ = {rho}")
for P in (2, 4):
    axes[0].plot(
        [P, P], [results[P][0]["ring"][1] / 1024, results[P][0]["Ulysses"][1] / 1024], "ko"
    )
axes[0].set_xlabel("ranks P"), axes[0].set_ylabel("KiB received per rank (S = 64)")
(
    axes[0].set_title("formulas (lines) and this run (dots, ρ = 2)", fontsize=9),
    axes[0].legend(fontsize=7),
)
axes[1].axhline(1, color="grey", linewidth=0.5)
(
    axes[1].set_xlabel("ranks P"),
    axes[1].set_ylabel("K/V gather bytes / Ulysses bytes"),
    axes[1].legend(fontsize=8),
)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Summary
#
# | Scheme | Moves | Needs | Good for |
# |---|---|---|---|
# | Ulysses | all-to-all of q, k, v, out | $h$ and $h_k$ divisible by $P$ | many heads, fast
# all-to-all (inside a node) |
# | ring | $P - 1$ K/V hops, overlapped with compute | LSE merge | any head count, across nodes |
# | zigzag ring | the same | $S$ divisible by $2P$ | causal attention, balanced work |
# | K/V gather | one all-gather of K/V | memory for the full K/V | strong GQA/MQA, small $P$,
# non-causal |
# | USP | Ulysses ($U$) + ring ($R$) | $h$ and $h_k$ divisible by $U$ | more ranks than heads |
#
# Replicated tokens (text prompts) stay out of the collectives and are attended once. The same
# classes run on the Triton kernels from `kernels.sequence_parallel`.
