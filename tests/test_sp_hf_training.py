"""A transformers Llama trained across ranks through ring-flash-attention's adapter equals the same
training in one process.

A tiny random-weight Llama (2 layers, 4 query heads over 2 KV heads) takes a packed batch of four
documents, 32 tokens, one of which straddles the two ranks' halves. Each of 2 gloo ranks runs the
model on its 16 tokens with ``substitute_hf_flash_attn`` + ``update_ring_flash_attn_params`` (the
llama3 schedule as every layer's attention), sums its tokens' cross-entropy over the whole batch's
token count, backpropagates and all-reduces the parameter gradients (sum): 3 SGD steps. One process
runs the same 3 steps on the whole batch with transformers' eager attention, which masks the packed
documents from ``position_ids`` (transformers' packed-sequence detection). Losses and every
parameter's gradient at every step agree within 1e-5 (fp32).

In bf16 (the model's weights and activations), the gradients of one step on 2 ranks meet
FlashAttention's rule against the same step in float64 in one process, the baseline being that step
in bf16 in one process (eager attention).
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.distributed as dist
import transformers

from attn_ref import sequence_parallel as sp
from attn_ref.sequence_parallel import hf_adapter
from tolerance import assert_close_fa

DOCS = (5, 13, 9, 5)  # S = 32 tokens; document 1 (tokens 5..17) straddles the ranks' halves
STEPS = 3
LR = 0.5
TOLERANCE = 1e-5
SPAWN_TIMEOUT_S = 480


def tiny_llama() -> transformers.LlamaForCausalLM:
    """The same random weights every call."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
        initializer_range=0.2,
    )
    return transformers.LlamaForCausalLM(config)


def packed_batch() -> dict:
    """``input_ids``, ``position_ids`` (restarting at each document), ``labels`` (the next token of
    the same document, -100 at each document's last token), all ``(1, S)``, and ``cu_seqlens``."""
    lengths = torch.tensor(DOCS)
    cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.int32), lengths.cumsum(0).to(torch.int32)])
    total = int(cu_seqlens[-1])
    input_ids = torch.randint(3, 128, (1, total), generator=torch.Generator().manual_seed(1))
    starts = torch.repeat_interleave(cu_seqlens[:-1], lengths)
    position_ids = (torch.arange(total) - starts)[None]
    labels = torch.cat([input_ids[:, 1:], torch.full((1, 1), -100)], dim=1)
    labels[:, cu_seqlens[1:] - 1] = -100  # a document's last token predicts nothing
    return dict(
        input_ids=input_ids, position_ids=position_ids, labels=labels, cu_seqlens=cu_seqlens
    )


def train(model, loss_of_step) -> dict:
    """``STEPS`` SGD steps; each step's loss and every parameter's gradient (before the update)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses, grads = [], []
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = loss_of_step(model)
        losses.append(loss)
        grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
        optimizer.step()
    return dict(losses=losses, grads=grads)


def summed_loss(model, batch: dict, rows: slice, tokens: int) -> torch.Tensor:
    """Cross-entropy of rows ``rows`` of the batch, summed and divided by the batch's ``tokens``
    counted labels."""
    logits = model(
        input_ids=batch["input_ids"][:, rows],
        position_ids=batch["position_ids"][:, rows],
        use_cache=False,  # transformers masks packed documents only without a cache
    ).logits
    return (
        torch.nn.functional.cross_entropy(
            logits[0], batch["labels"][0, rows], ignore_index=-100, reduction="sum"
        )
        / tokens
    )


def one_process(dtype: torch.dtype = torch.float32) -> dict:
    """The whole batch in one process, transformers' eager attention, the model in ``dtype``."""
    batch, model = packed_batch(), tiny_llama().to(dtype)
    model.set_attn_implementation("eager")
    tokens = int((batch["labels"] != -100).sum())

    def step(model):
        loss = summed_loss(model, batch, slice(None), tokens)
        loss.backward()
        return loss.detach()

    return train(model, step)


def run_rank(heads_k_stride: int) -> dict:
    """The fp32 training and the bf16 gradients of one step on this rank."""
    sp.substitute_hf_flash_attn(None, heads_k_stride)
    first_bf16_step = rank_training(torch.bfloat16)["grads"][0]
    return dict(rank_training(torch.float32), first_bf16_step=first_bf16_step)


def rank_training(dtype: torch.dtype) -> dict:
    """This rank's half of the batch through the adapter, the model in ``dtype``; gradients and loss
    all-reduced."""
    world, rank = dist.get_world_size(), dist.get_rank()
    batch, model = packed_batch(), tiny_llama().to(dtype)
    model.set_attn_implementation(hf_adapter.RING_ATTN_IMPLEMENTATION)
    total = batch["input_ids"].shape[1]
    rows = slice(rank * total // world, (rank + 1) * total // world)
    tokens = int((batch["labels"] != -100).sum())

    def step(model):
        sp.update_ring_flash_attn_params(batch["cu_seqlens"], None)
        loss = summed_loss(model, batch, rows, tokens)
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        loss = loss.detach()
        dist.all_reduce(loss)
        return loss

    return train(model, step)


# --------------------------------------------------------------------------------------------------
# One process
# --------------------------------------------------------------------------------------------------


def test_the_batch_straddles_the_ranks_and_the_labels_stay_in_their_documents():
    batch = packed_batch()
    assert batch["cu_seqlens"].tolist() == [0, 5, 18, 27, 32]
    assert batch["position_ids"][0, 15:19].tolist() == [10, 11, 12, 0]
    assert (batch["labels"] != -100).sum() == 32 - len(DOCS)


def test_adapter_refusals_are_upstreams_words():
    model = tiny_llama()
    module = model.model.layers[0].self_attn
    q = torch.randn(1, 4, 8, 16)
    kv = torch.randn(1, 2, 8, 16)
    hf_adapter.DATA_PARAMS.clear()
    calls = [
        (
            dict(softcap=5.0),
            NotImplementedError,
            "llama3_flash_attn_varlen_func does not support softcap yet.",
        ),
        (dict(is_causal=False), NotImplementedError, "only causal attention is supported yet."),
        (dict(batch=2), ValueError, "varlen data should be processed in advance."),
        (dict(), ValueError, "the ring attention has no offsets for this batch"),
    ]
    for kwargs, exc, message in calls:
        rows = kwargs.pop("batch", 1)
        with pytest.raises(exc, match=re.escape(message)):
            hf_adapter.ring_attention_forward(
                None, 1, sp.REFERENCE_BACKEND, module, q.expand(rows, -1, -1, -1), kv, kv, **kwargs
            )


# --------------------------------------------------------------------------------------------------
# Across ranks
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs():
    return dict(
        single=one_process(),
        ranks=sp.launch(run_rank, 2, (1,), timeout_s=SPAWN_TIMEOUT_S),
    )


@pytest.mark.timeout(SPAWN_TIMEOUT_S + 60)
def test_two_ranks_train_like_one_process(runs):
    single = runs["single"]
    for report in runs["ranks"]:
        for step in range(STEPS):
            assert abs(report["losses"][step] - single["losses"][step]) <= TOLERANCE
            for name, grad in single["grads"][step].items():
                torch.testing.assert_close(
                    report["grads"][step][name], grad, atol=TOLERANCE, rtol=0, msg=name
                )
    # the steps change the model: three different losses
    assert len({round(float(x), 6) for x in single["losses"]}) == STEPS


@pytest.mark.timeout(SPAWN_TIMEOUT_S + 60)
def test_two_ranks_in_bf16_meet_flash_attentions_rule(runs):
    reference = one_process(torch.float64)["grads"][0]
    baseline = one_process(torch.bfloat16)["grads"][0]
    for report in runs["ranks"]:
        for name, grad in reference.items():
            assert report["first_bf16_step"][name].dtype == torch.bfloat16
            assert_close_fa(report["first_bf16_step"][name], grad, baseline[name])
