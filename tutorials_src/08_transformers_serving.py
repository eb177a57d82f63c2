# %% [markdown]
# # Serving a transformers model from a paged KV cache
#
# `generate` keeps the keys and values in transformers' own cache, one dense tensor per layer. A
# serving engine (vLLM, sglang) does it differently: it owns one pool of fixed-size **pages** per
# layer, gives each request pages as it grows, runs requests of different lengths together, and
# takes new requests in and finished ones out between steps. `flash_attn_with_kvcache` is the
# attention call of such an engine (sglang's FA3 backend calls exactly this function).
#
# This notebook writes that loop in about a hundred lines around a tiny random-weight Llama (GQA: 4
# query heads over 2 key/value heads) from transformers, with `attn_ref.flash_attn_with_kvcache`
# doing every attention:
#
# * a paged KV cache, its pages handed out from a **shuffled** free list (a request's pages are
#   scattered, as in a real engine);
# * **prefill** of prompts of different lengths, once **packed** (varlen: `cu_seqlens_q`) and once
#   **batched** (right-padded to the longest prompt);
# * **decode** steps that append each new key and value in place at `cache_seqlens` (`k=`, `v=`);
# * requests **admitted and retired** between steps, their pages reused;
#
# and checks every request's tokens against transformers' `generate`. At the end, transformers
# itself calls this package instead (its cache, your model: `register()`), with what that supports
# and refuses; *Using attn-ref with transformers* has the details.

# %%
import warnings

import torch

# transformers imports tqdm.auto, which warns in a notebook without ipywidgets (progress bars are
# not used here)
warnings.filterwarnings("ignore", message="IProgress not found")
import transformers
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from attn_ref import flash_attn_with_kvcache

torch.manual_seed(0)
config = transformers.LlamaConfig(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=128,
    initializer_range=0.2,
)
model = transformers.LlamaForCausalLM(config).eval()
layers, heads, heads_k, dim = (
    config.num_hidden_layers,
    config.num_attention_heads,
    config.num_key_value_heads,
    config.head_dim,
)

# %% [markdown]
# ## The model, layer by layer, with the attention left open
#
# A serving engine runs the model's weights with its own attention. `run_model` does that with
# transformers' modules: embeddings, rotary, the projections, the MLPs. Every attention is a call
# `attend(layer, q, k, v)` on the layout of `flash_attn_with_kvcache`, `(batch, seqlen, heads,
# dim)`. Rotary is applied here with transformers' own function (Llama rotates halves: GPT-NeoX
# style), at the positions the caller gives; the cache then stores rotated keys, as FA3's in-kernel
# rotary would.


# %%
def run_model(input_ids, positions, attend):
    """Logits ``(b, s, vocab)`` of tokens ``(b, s)`` at ``positions`` ``(b, s)``;
    ``attend(layer, q, k, v)`` takes ``(b, s, heads|heads_k, dim)`` and returns ``(b, s, heads,
    dim)``."""
    b, s = input_ids.shape
    x = model.model.embed_tokens(input_ids)
    cos, sin = model.model.rotary_emb(x, positions)  # (b, s, dim)
    for index, layer in enumerate(model.model.layers):
        attention, hidden = layer.self_attn, layer.input_layernorm(x)
        q = attention.q_proj(hidden).view(b, s, heads, dim)
        k = attention.k_proj(hidden).view(b, s, heads_k, dim)
        v = attention.v_proj(hidden).view(b, s, heads_k, dim)
        q, k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)
        x = x + attention.o_proj(attend(index, q, k, v).reshape(b, s, heads * dim))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.lm_head(model.model.norm(x))


# dim ** -0.5 for Llama: flash_attn_with_kvcache's default too
scale = model.model.layers[0].self_attn.scaling

# %% [markdown]
# ## The paged cache
#
# Per layer, `k_pages` and `v_pages` are `(num_pages, page_size, h_k, d)`. A request owns a
# row of the page table: logical token `p` of the request lives in page `page_table[row, p //
# page_size]` at slot `p % page_size`. Pages come from a free list in random order, so consecutive
# pages of a request are far apart in memory, and the attention must follow the table.

# %%
page_size, num_pages, rows, pages_per_row = 4, 24, 5, 8
k_pages = torch.zeros(layers, num_pages, page_size, heads_k, dim)
v_pages = torch.zeros(layers, num_pages, page_size, heads_k, dim)
page_table = torch.zeros(rows, pages_per_row, dtype=torch.int32)
free_pages = torch.randperm(num_pages).tolist()  # shuffled
free_rows = list(range(rows))


class Request:
    def __init__(self, name, prompt, new_tokens):
        self.name, self.prompt, self.new_tokens = name, prompt, new_tokens
        self.tokens = []  # generated so far
        self.length = 0  # tokens in the cache
        self.row = free_rows.pop(0)
        self.pages = []

    def reserve(self, length):
        """Pages for ``length`` tokens in the cache."""
        while len(self.pages) * page_size < length:
            self.pages.append(free_pages.pop())
            page_table[self.row, len(self.pages) - 1] = self.pages[-1]

    def retire(self):
        free_pages.extend(self.pages)
        free_rows.append(self.row)

    @property
    def done(self):
        return len(self.tokens) == self.new_tokens


# %% [markdown]
# ## Prefill, packed
#
# The prompts of newly admitted requests go in as **one** row of tokens, `(1, total, ...)` for
# `run_model`, and as `(total, heads, dim)` with `cu_seqlens_q` for the attention: each prompt's
# queries attend to its own keys only. `k=` / `v=` (packed the same way, `cu_seqlens_k_new`) are
# written into the pages at `cache_seqlens` (0: the requests are new), then attended, causally.


# %%
def prefill_packed(requests):
    lengths = torch.tensor([len(r.prompt) for r in requests], dtype=torch.int32)
    cu_seqlens = torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    for r in requests:
        r.reserve(len(r.prompt))
    table = page_table[[r.row for r in requests]]
    ids = torch.cat([r.prompt for r in requests])[None]
    positions = torch.cat([torch.arange(len(r.prompt)) for r in requests])[None]

    def attend(layer, q, k, v):
        out = flash_attn_with_kvcache(
            q[0],
            k_pages[layer],
            v_pages[layer],
            k=k[0],
            v=v[0],
            page_table=table,
            cache_seqlens=torch.zeros(len(requests), dtype=torch.int32),
            cu_seqlens_q=cu_seqlens,
            cu_seqlens_k_new=cu_seqlens,
            max_seqlen_q=int(lengths.max()),
            softmax_scale=scale,
            causal=True,
        )
        return out[None]  # (1, total, heads, dim)

    logits = run_model(ids, positions, attend)[0]
    for r, end in zip(requests, cu_seqlens[1:].tolist()):
        r.length = len(r.prompt)
        r.tokens.append(int(logits[end - 1].argmax()))


# %% [markdown]
# ## Prefill, batched
#
# The same for a batch `(b, longest, ...)`, shorter prompts padded on the **right**. With
# `cache_seqlens = 0` and `causal=True` the query at position `i` sees keys `0..i`, so a prompt's
# real tokens never see the padding after them. The padding's keys are written to the pages behind
# the prompt; nothing reads them, and the next token the request appends (at `cache_seqlens`, its
# real length) overwrites the first.


# %%
def prefill_batched(requests):
    longest = max(len(r.prompt) for r in requests)
    ids = torch.zeros(len(requests), longest, dtype=torch.long)
    for i, r in enumerate(requests):
        ids[i, : len(r.prompt)] = r.prompt
        r.reserve(longest)
    table = page_table[[r.row for r in requests]]
    positions = torch.arange(longest).expand(len(requests), longest)

    def attend(layer, q, k, v):
        return flash_attn_with_kvcache(
            q,
            k_pages[layer],
            v_pages[layer],
            k=k,
            v=v,
            page_table=table,
            cache_seqlens=torch.zeros(len(requests), dtype=torch.int32),
            softmax_scale=scale,
            causal=True,
        )

    logits = run_model(ids, positions, attend)
    for i, r in enumerate(requests):
        r.length = len(r.prompt)
        r.tokens.append(int(logits[i, len(r.prompt) - 1].argmax()))


# %% [markdown]
# ## Decode
#
# One token per running request: `q` is `(b, 1, heads, dim)`; its key and value are appended in
# place at `cache_seqlens` (each request's own length) and attended with everything before them.


# %%
def decode(requests):
    for r in requests:
        r.reserve(r.length + 1)
    table = page_table[[r.row for r in requests]]
    lengths = torch.tensor([r.length for r in requests], dtype=torch.int32)
    ids = torch.tensor([[r.tokens[-1]] for r in requests])

    def attend(layer, q, k, v):
        return flash_attn_with_kvcache(
            q,
            k_pages[layer],
            v_pages[layer],
            k=k,
            v=v,
            page_table=table,
            cache_seqlens=lengths,
            softmax_scale=scale,
            causal=True,
        )

    logits = run_model(ids, lengths[:, None].long(), attend)
    for i, r in enumerate(requests):
        r.length += 1
        r.tokens.append(int(logits[i, -1].argmax()))


# %% [markdown]
# ## The loop
#
# Requests arrive over time, each with its own prompt length and number of tokens to generate. Each
# step retires the finished requests (their row and pages go back to the free lists), admits the
# arrived ones while page-table rows are free (one prefill for all admitted together: packed or
# batched, as the schedule says), and decodes one token for every request that was already running.

# %%
arrivals = [  # (step, name, prompt length, tokens to generate, prefill)
    (0, "a", 5, 6, prefill_packed),
    (0, "b", 9, 3, prefill_packed),
    (0, "c", 3, 8, prefill_packed),
    (2, "d", 4, 5, prefill_batched),
    (2, "e", 7, 4, prefill_batched),
    (2, "f", 6, 4, prefill_packed),  # no free row at step 2: waits for one
]
prompts = {name: torch.randint(3, config.vocab_size, (n,)) for _, name, n, _, _ in arrivals}
waiting, running, finished = list(arrivals), [], []

with torch.no_grad():
    for step in range(20):
        retired = [r for r in running if r.done]
        for r in retired:
            r.retire()
            running.remove(r)
        finished += retired
        arrived = [a for a in waiting if a[0] <= step]
        kind = arrived[0][4] if arrived else None  # one prefill per step: the first arrival's kind
        admitted = [a for a in arrived if a[4] is kind][: len(free_rows)]
        for a in admitted:
            waiting.remove(a)
        new = [Request(name, prompts[name], n) for _, name, _, n, _ in admitted]
        decoding = list(running)
        if new:
            admitted[0][4](new)
        if decoding:
            decode(decoding)
        running += new
        print(
            f"step {step:2d}: retired {[r.name for r in retired]}, "
            f"{admitted[0][4].__name__ if new else 'no prefill'} "
            f"{[r.name for r in new]}, decode {[r.name for r in decoding]}"
        )
        if not running and not waiting:
            break
print("free pages:", len(free_pages), "of", num_pages)

# %% [markdown]
# `d` and `e` (4 and 7 prompt tokens) are prefilled together, batched; `f` arrives with them but
# finds no free page-table row until `b` is retired, and then takes `b`'s row and pages. Every page
# is free again at the end.
#
# ## Check against transformers
#
# Each request, alone, through transformers' `generate` (eager attention, its own dense cache):
# the same greedy tokens.

# %%
for r in sorted(finished, key=lambda r: r.name):
    expected = model.generate(
        r.prompt[None], max_new_tokens=r.new_tokens, do_sample=False, pad_token_id=0
    )
    expected = expected[0, len(r.prompt) :].tolist()
    assert r.tokens == expected, (r.name, r.tokens, expected)
    print(f"{r.name}: prompt {len(r.prompt)} tokens, generated {r.tokens} == generate")

# %% [markdown]
# The same loop runs on the Triton kernels by importing `flash_attn_with_kvcache` from `kernels`
# instead (on a CPU, with `TRITON_INTERPRET=1` set before the import). What changes in a real
# engine is scale, not shape: thousands of pages, CUDA graphs around `decode`, and chunked prefill
# (a prompt's chunks appended at growing `cache_seqlens`, which this same call also does).
#
# ## Letting transformers call attn-ref instead
#
# Without a loop of your own, `register()` adds `"attn_ref"` (and `"attn_ref_kernels"`) to
# transformers' attention implementations: transformers keeps its cache and its `generate`, and
# runs every attention layer as one `flash_attn_varlen_func` call (the mask transformers builds,
# padding and packed sequences dropped into the varlen layout, the window read off the mask, the
# attention sinks of models such as GPT-OSS passed as `sinks`), forward and backward. Here the same
# model generates for the same requests, all together in one **right-padded** batch, the padding
# that this loop's batched prefill also uses: the token each request predicts after its prompt is
# the loop's first token.

# %%
from attn_ref.integrations.transformers import UnsupportedAttention, check_model, register

register()
check_model(model)  # Llama calls its attention through transformers' AttentionInterface
model.set_attn_implementation("attn_ref")
requests = sorted(finished, key=lambda r: r.name)
longest = max(len(r.prompt) for r in requests)
input_ids = torch.zeros(len(requests), longest, dtype=torch.long)
attention_mask = torch.zeros(len(requests), longest, dtype=torch.long)
for i, r in enumerate(requests):
    input_ids[i, : len(r.prompt)] = r.prompt
    attention_mask[i, : len(r.prompt)] = 1
with torch.no_grad():
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
for i, r in enumerate(requests):
    first = int(logits[i, len(r.prompt) - 1].argmax())  # the token after the prompt
    assert first == r.tokens[0], (r.name, first, r.tokens[0])
print("first tokens of", [r.name for r in requests], "==", [r.tokens[0] for r in requests])

# %% [markdown]
# What it computes and what it refuses is listed on the page *Using attn-ref with transformers*:
# padding on either side, sliding windows, softcap, sinks, packed sequences and training are
# computed, each checked against eager attention; what a varlen call cannot express is refused
# with a catalogued `UnsupportedAttention` **before** any attention is computed, never computed
# another way: attention dropout, `output_attentions=True` (FlashAttention never forms the
# probabilities), non-causal layers, custom 4-D masks, and models that do not call their attention
# through transformers' `AttentionInterface` (Falcon: `check_model` says so). One of them:

# %%
import errors

try:
    with torch.no_grad():
        model(input_ids=input_ids, attention_mask=attention_mask, output_attentions=True)
except UnsupportedAttention as error:
    entry = errors.lookup(error)
    assert entry["slug"] == "transformers/output-attentions"
    print(f"{error}\n  -> catalog entry {entry['id']}: {entry['slug']}")
else:
    raise AssertionError("expected UnsupportedAttention")
model.set_attn_implementation("eager")
