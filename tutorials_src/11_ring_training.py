# %% [markdown]
# # Training a transformers model across ranks
#
# Long-context fine-tuning packs documents into one long row and spreads that row over several
# GPUs. The trainers built on ring-flash-attention do it in three lines: `substitute_hf_flash_attn`
# makes a Hugging Face model's attention the **llama3 schedule** (every rank all-gathers the keys
# and values, a few KV heads at a time, and attends its own queries over the slice of keys their
# documents need;
# [Sequence parallelism](../../concepts/sequence-parallel/#llama3-kv-gathered-by-head-strides)),
# `update_ring_flash_attn_params` tells it where the documents of each batch start and end, and
# each rank runs the model on its share of the tokens.
#
# This notebook does that with `attn_ref.sequence_parallel`, which has the same functions, on 2
# CPU processes started by the package's launcher. It trains a tiny random-weight Llama for 3
# SGD steps on a packed batch whose documents straddle the two ranks, then trains the same model
# the same 3 steps in one process with transformers' own eager attention, and checks that losses
# and every parameter's gradient agree. Along the way it counts the bytes each rank receives.

# %%
import os
import shutil
import sys
import tempfile
import warnings

import torch

from attn_ref import sequence_parallel as sp

# transformers imports tqdm.auto, which warns in a notebook without ipywidgets (no progress bars
# are shown here)
warnings.filterwarnings("ignore", message="IProgress not found")

# %% [markdown]
# ## A packed batch
#
# Four documents of 5, 13, 9 and 5 tokens, back to back: `S = 32` tokens, `cu_seqlens` their
# offsets. The positions restart at each document (rotary embeddings then see each document on its
# own), and each token's label is the next token *of the same document*: a document's last token
# predicts nothing (`-100`, ignored by the loss).
#
# With `P = 2` ranks, rank `r` holds tokens `[16 r, 16 (r + 1))`. Document 1 (tokens 5..17)
# straddles the edge: rank 1's first two queries need keys 5..15, which rank 0 holds.
# `llama3_flash_attn_prepare_cu_seqlens` computes, without any communication, which rows and keys
# each rank needs (`update_ring_flash_attn_params` calls it for the model).

# %%
docs = torch.tensor([5, 13, 9, 5])
cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.int32), docs.cumsum(0).to(torch.int32)])
S, P = int(cu_seqlens[-1]), 2
input_ids = torch.randint(3, 128, (1, S), generator=torch.Generator().manual_seed(1))
position_ids = (torch.arange(S) - torch.repeat_interleave(cu_seqlens[:-1], docs))[None]
labels = torch.cat([input_ids[:, 1:], torch.full((1, 1), -100)], dim=1)
labels[:, cu_seqlens[1:] - 1] = -100
print("cu_seqlens:", cu_seqlens.tolist())
print("position_ids:", position_ids[0].tolist())
for rank in range(P):
    cu_q, cu_k, max_q, max_k, keys = sp.llama3_flash_attn_prepare_cu_seqlens(
        cu_seqlens, True, rank, P
    )
    print(
        f"rank {rank}: queries {rank * S // P}..{(rank + 1) * S // P - 1}, "
        f"cu_seqlens_q {cu_q.tolist()}, cu_seqlens_k {cu_k.tolist()}, "
        f"keys {keys.start}..{keys.stop - 1}"
    )

# %% [markdown]
# ## What every rank runs
#
# `sp.launch(fn, world_size, args)` starts `world_size` processes, initialises a gloo (CPU) process
# group in each, calls `fn(*args)` on every rank and returns the per-rank results. The processes are
# *spawned*, so `fn` must live in a module they can import: the next cell writes it to a temporary
# folder. Each rank
#
# 1. builds the same tiny Llama (2 layers, 4 query heads over 2 KV heads, head dim 16, random
#    weights from one seed);
# 2. calls `substitute_hf_flash_attn(None, 1)` (the whole world, one KV head per all-gather) and
#    selects the substituted attention with `model.set_attn_implementation("llama3_ring_attn")`
#    (on a GPU with the `flash_attn` package, a model loaded with
#    `attn_implementation="flash_attention_2"` gets it as well, as with ring-flash-attention);
# 3. each step: `update_ring_flash_attn_params(cu_seqlens, None)`, the model on its 16 tokens, the
#    cross-entropy of its tokens summed and divided by the whole batch's label count (so the ranks'
#    losses add up to the batch's mean loss), backward, an all-reduce (sum) of every parameter's
#    gradient, one SGD step.
#
# It also counts the bytes the schedule's collectives bring in from the other rank, by wrapping
# `torch.distributed`'s `all_gather_single` and `reduce_scatter_single`.

# %%
workers_dir = os.path.join(tempfile.gettempdir(), "attn_ref_ring_training_tutorial")
shutil.rmtree(workers_dir, ignore_errors=True)  # start from an empty folder
os.makedirs(workers_dir)
sys.path.insert(0, workers_dir)  # spawned ranks inherit sys.path, so they find the module too

# %%
# %%writefile {workers_dir}/ring_training_workers.py
"""Per-rank code of the ring-training tutorial, and the same training in one process."""
import torch
import torch.distributed as dist
import transformers

from attn_ref import sequence_parallel as sp  # noqa: F811 (this cell is the workers' module)

STEPS, LR = 3, 0.5
received = {"bytes": 0}


def tiny_llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        initializer_range=0.2,
    )
    return transformers.LlamaForCausalLM(config)


def loss_of(model, input_ids, position_ids, labels, tokens):
    """Cross-entropy of these tokens, summed, over the whole batch's label count."""
    logits = model(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits
    loss = torch.nn.functional.cross_entropy(logits[0], labels[0], reduction="sum")
    return loss / tokens  # labels -100 are ignored


def train(model, step):
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses, grads = [], []
    for _ in range(STEPS):
        optimizer.zero_grad()
        losses.append(step(model))
        grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
        optimizer.step()
    return losses, grads


def count_received(collective):
    """``collective`` (a one-tensor all-gather or reduce-scatter), adding what the others send."""

    def counted(output, x, *args, **kwargs):
        smaller = min(output.numel(), x.numel()) * x.element_size()  # this rank's block
        received["bytes"] += (dist.get_world_size() - 1) * smaller
        return collective(output, x, *args, **kwargs)

    return counted


def rank_training(cu_seqlens, input_ids, position_ids, labels):
    world, rank = dist.get_world_size(), dist.get_rank()
    dist.all_gather_single = count_received(dist.all_gather_single)
    dist.reduce_scatter_single = count_received(dist.reduce_scatter_single)
    model = tiny_llama()
    sp.substitute_hf_flash_attn(None, 1)
    model.set_attn_implementation("llama3_ring_attn")
    share = input_ids.shape[1] // world
    mine = slice(rank * share, (rank + 1) * share)
    tokens = int((labels != -100).sum())

    def step(model):
        sp.update_ring_flash_attn_params(cu_seqlens, None)
        loss = loss_of(model, input_ids[:, mine], position_ids[:, mine], labels[:, mine], tokens)
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        loss = loss.detach()
        dist.all_reduce(loss)
        return loss

    losses, grads = train(model, step)
    return losses, grads, received["bytes"]


def one_process_training(input_ids, position_ids, labels):
    """The same steps on the whole batch: transformers' eager attention, which masks the packed
    documents from position_ids."""
    model = tiny_llama()
    model.set_attn_implementation("eager")
    tokens = int((labels != -100).sum())

    def step(model):
        loss = loss_of(model, input_ids, position_ids, labels, tokens)
        loss.backward()
        return loss.detach()

    return train(model, step)


# %% [markdown]
# ## Two ranks, then one process
#
# Starting the ranks takes a few seconds (each imports torch and transformers).

# %%
import ring_training_workers as workers

ranks = sp.launch(workers.rank_training, P, (cu_seqlens, input_ids, position_ids, labels))
single_losses, single_grads = workers.one_process_training(input_ids, position_ids, labels)

for step in range(workers.STEPS):
    worst = max(
        (ranks[r][1][step][name] - grad).abs().max().item()
        for r in range(P)
        for name, grad in single_grads[step].items()
    )
    loss_gap = max(abs(ranks[r][0][step] - single_losses[step]).item() for r in range(P))
    print(
        f"step {step}: loss {single_losses[step]:.5f} (one process), "
        f"{ranks[0][0][step]:.5f} (2 ranks); largest loss difference {loss_gap:.1e}, "
        f"largest gradient difference {worst:.1e}"
    )
    assert loss_gap <= 1e-5 and worst <= 1e-5
assert single_losses[-1] < single_losses[0]

# %% [markdown]
# The two ranks train exactly like one process, to fp32 rounding: each rank's queries saw every
# key of their document, wherever it lived, and the backward's reduce-scatter handed every rank the
# gradients of its own keys and values from both ranks' queries.
#
# ## The bytes
#
# Per attention layer and step, the forward all-gathers K and V (`h_k / heads_k_stride` times one
# KV head): each rank receives `(P - 1) · (S / P) · 2 h_k · d · e` bytes, `e = 4` in fp32. The
# backward gathers them again and reduce-scatters `dK`, `dV` (fp32): `(P - 1) · (S / P) · 2 h_k · d
# · (e + 4)`. Two layers, three steps:

# %%
h_k, d, e, layers = 2, 16, 4, 2
forward = (P - 1) * (S // P) * 2 * h_k * d * e
backward = (P - 1) * (S // P) * 2 * h_k * d * (e + 4)
formula = workers.STEPS * layers * (forward + backward)
for rank in range(P):
    print(f"rank {rank}: {ranks[rank][2]:,} bytes received, formula {formula:,}")
    assert ranks[rank][2] == formula

# %% [markdown]
# The same bytes as a ring would move (`P - 1` hops of the local K and V), gathered in one
# collective per KV-head stride instead of `P - 1` point-to-point steps; what the strides save is
# memory: only `2 · S · heads_k_stride · d` gathered elements are alive at a time. The
# [concept page](../../concepts/sequence-parallel/#llama3-kv-gathered-by-head-strides)
# puts the schedule beside the ring's, and `torchrun --nproc-per-node 2 script.py` with
# `torch.distributed.init_process_group("nccl")` runs the same rank code on GPUs.
