# %% [markdown]
# # Training on packed sequences
#
# Training batches hold sequences of different lengths. Instead of padding them to the longest,
# FlashAttention packs them one after another and attends each on its own
# (`flash_attn_varlen_func`, [Packed sequences](../../concepts/varlen/)); its backward recomputes
# the probabilities from the saved output and LSE ([The backward](../../concepts/backward/)).
#
# This notebook trains a small model, one attention layer between two projections, for a few
# optimizer steps on a packed batch with the reference's `attn_ref.flash_attn_varlen_func`
# (causal, grouped-query heads, a learnable attention sink per head). The attention runs in bf16,
# as it would under mixed precision on a GPU. At every step it checks the gradients that the
# attention hands back (of q, k, v and the sinks) against float64 autograd of the dense formula
# (`attn_ref/dense.py`), by FlashAttention's tolerance rule, and the loss goes down. It runs on a
# laptop CPU in seconds.

# %%
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import attn_ref
from attn_ref import dense
from attn_ref.conformance.tolerance import fa_error

_ = torch.manual_seed(0)

# %% [markdown]
# ## A padded batch, packed
#
# Six sequences of 3 to 16 tokens, each token a random feature vector of size `d_model`. The task
# is causal and stays inside each sequence: the target of token $t$ is the mean of its sequence's
# tokens $0..t$. Uniform causal attention solves it exactly, so the layer can learn it; attention
# that leaks into a neighbouring sequence cannot.
#
# The data comes padded, with a boolean mask of the real tokens, as a tokenizer returns it. Packing
# keeps the real tokens in order (`indices`, their flat positions); `cu_seqlens` are the cumulative
# lengths with a 0 in front.

# %%
lengths = [5, 12, 3, 9, 16, 7]
b, s_max, d_model = len(lengths), max(lengths), 32
mask = torch.arange(s_max)[None, :] < torch.tensor(lengths)[:, None]  # (b, s_max): real tokens
x_padded = torch.randn(b, s_max, d_model) * mask[..., None]
running_mean = x_padded.cumsum(1) / torch.arange(1, s_max + 1)[None, :, None]
y_padded = running_mean * mask[..., None]

seqlens = mask.sum(dim=1, dtype=torch.int32)
cu_seqlens = F.pad(seqlens.cumsum(0, dtype=torch.int32), (1, 0))
max_seqlen = int(seqlens.max())
indices = mask.flatten().nonzero().squeeze(1)
x, y = x_padded.flatten(0, 1)[indices], y_padded.flatten(0, 1)[indices]  # (total_q, d_model)

print("cu_seqlens:", cu_seqlens.tolist(), " max_seqlen:", max_seqlen)
print(f"packed: {tuple(x.shape)} instead of padded {tuple(x_padded.shape)}")

# %% [markdown]
# ## The model
#
# Projections to $h = 4$ query heads and $h_k = 2$ key/value heads of size $d = 16$ (GQA: each KV
# head serves $g = 2$ query heads), the attention on the packed rows, and a projection back to
# `d_model`. The weights are fp32; q, k and v are cast to bf16 for the attention and its output
# back to fp32. The sinks are one logit per query head, fp32, learnable. `forward` also returns the
# attention's q, k, v and output, so that the check below can ask for their gradients.


# %%
class PackedAttentionLayer(torch.nn.Module):
    def __init__(self, d_model, h, h_k, d):
        super().__init__()
        self.h, self.h_k, self.d = h, h_k, d
        self.wq = torch.nn.Linear(d_model, h * d, bias=False)
        self.wk = torch.nn.Linear(d_model, h_k * d, bias=False)
        self.wv = torch.nn.Linear(d_model, h_k * d, bias=False)
        self.wo = torch.nn.Linear(h * d, d_model, bias=False)
        self.sinks = torch.nn.Parameter(torch.zeros(h))

    def forward(self, x, cu_seqlens, max_seqlen):
        """x (total_q, d_model) -> prediction (total_q, d_model), and the attention's (q, k, v,
        out)."""
        total = x.shape[0]
        q = self.wq(x).view(total, self.h, self.d).bfloat16()  # (total_q, h, d)
        k = self.wk(x).view(total, self.h_k, self.d).bfloat16()  # (total_q, h_k, d)
        v = self.wv(x).view(total, self.h_k, self.d).bfloat16()  # (total_q, h_k, d)
        out = attn_ref.flash_attn_varlen_func(
            q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, causal=True, sinks=self.sinks
        )  # (total_q, h, d), bf16
        return self.wo(out.float().flatten(1)), (q, k, v, out)


layer = PackedAttentionLayer(d_model, h=4, h_k=2, d=16)

# %% [markdown]
# Before training, what packing means for the attention: each sequence attends only to itself.
# The packed call gives what a call on each sequence alone gives, and not what one causal mask over
# the whole pack gives (`cu_seqlens = [0, total_q]`), which lets every sequence see the ones before
# it.


# %%
def attend(q, k, v, cu_seqlens, max_seqlen):
    """The layer's attention call, on any packing of the rows."""
    return attn_ref.flash_attn_varlen_func(
        q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, causal=True, sinks=layer.sinks
    )


with torch.no_grad():
    _, (q, k, v, out) = layer(x, cu_seqlens, max_seqlen)
    starts = cu_seqlens.tolist()
    for a, end in zip(starts, starts[1:]):
        alone = torch.tensor([0, end - a], dtype=torch.int32)
        assert torch.equal(out[a:end], attend(q[a:end], k[a:end], v[a:end], alone, end - a))
    total = x.shape[0]
    one_mask = attend(q, k, v, torch.tensor([0, total], dtype=torch.int32), total)
print("each sequence alone: bitwise the packed output")
for i, (a, end) in enumerate(zip(starts, starts[1:])):
    leak = (one_mask[a:end] - out[a:end]).float().abs().max().item()
    print(f"sequence {i}: max |one causal mask over the pack - packed| = {leak:.3f}")

# %% [markdown]
# ## The check: float64 autograd of the dense formula, by FlashAttention's rule
#
# `attn_ref.dense.attention` is the formula and nothing else (the whole score matrix, the sink as
# one more logit, no in-place operation), so `torch.autograd` differentiates it. From the same bf16
# inputs and the same output gradient $dO$ it gives two sets of gradients, one sequence at a time:
#
# * the **reference** gradients, in float64;
# * the **low-precision baseline**: the same formula computed in bf16 (`upcast=False`), which is how
#   far plain bf16 arithmetic lands from float64.
#
# FlashAttention's rule (the tests' and the conformance suite's, `attn_ref.conformance.tolerance`)
# lets a gradient be at most twice as far from float64 as the baseline (in max, 1.5 times in mean,
# plus $10^{-5}$). `fa_error` returns the measured error over the allowed one: at most 1 passes.


# %%
def dense_gradients(q, k, v, sinks, dout, cu_seqlens, upcast):
    """Gradients of (q, k, v, sinks) for the loss Σ out·dO through attn_ref.dense.attention, one
    sequence at a time: float64 (upcast=True) or in the inputs' own dtype (upcast=False)."""
    cast = (lambda t: t.double()) if upcast else (lambda t: t)
    leaves = [cast(t.detach()).requires_grad_() for t in (q, k, v, sinks)]
    starts = cu_seqlens.tolist()
    out = torch.cat(
        [
            dense.attention(
                *(t[None, a:end] for t in leaves[:3]),
                causal=True,
                sinks=leaves[3],
                upcast=upcast,
            )[0][0]
            for a, end in zip(starts, starts[1:])
        ]
    )
    out.backward(dout.to(out.dtype))
    return [t.grad for t in leaves]


def check_gradients(inputs, grads, dout, cu_seqlens):
    """FA's rule for the gradients of (q, k, v, sinks): the ratio measured / allowed of each."""
    reference = dense_gradients(*inputs, dout, cu_seqlens, upcast=True)
    baseline = dense_gradients(*inputs, dout, cu_seqlens, upcast=False)
    ratios = {}
    for name, grad, ref, low in zip(("dq", "dk", "dv", "dsinks"), grads, reference, baseline):
        ratios[name], what = fa_error(grad, ref, low)
        assert ratios[name] <= 1, f"{name}: {what}"
    return ratios


# %% [markdown]
# ## Training
#
# Mean squared error against the running means, and plain gradient descent written out. Each step
# asks autograd for the gradients of the weights and, from the same backward, of the attention's
# q, k, v and output. The output's gradient is the $dO$ the attention's backward received; q, k, v
# and the sinks' gradients are what it returned, so the check compares them with the dense formula
# differentiated from the same $dO$.

# %%
params = list(layer.parameters())
lr, steps = 3.0, 30
history = []
for step in range(steps):
    pred, (q, k, v, out) = layer(x, cu_seqlens, max_seqlen)
    loss = F.mse_loss(pred, y)
    *param_grads, dq, dk, dv, dout = torch.autograd.grad(loss, [*params, q, k, v, out])
    dsinks = param_grads[params.index(layer.sinks)]
    ratios = check_gradients((q, k, v, layer.sinks), (dq, dk, dv, dsinks), dout, cu_seqlens)
    history.append((loss.item(), ratios))
    if step % 5 == 0 or step == steps - 1:
        shown = ", ".join(f"{name} {ratio:.2f}" for name, ratio in ratios.items())
        print(f"step {step:2d}: loss {loss.item():.4f}   error / allowed: {shown}")
    with torch.no_grad():
        for p, g in zip(params, param_grads):
            p -= lr * g

losses = [loss for loss, _ in history]
assert losses[-1] < 0.2 * losses[0], losses
print(
    f"loss {losses[0]:.4f} -> {losses[-1]:.4f} ({losses[0] / losses[-1]:.0f} times lower); "
    "every step's gradients within FA's rule"
)

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.2))
left.plot(losses, "o-", markersize=3)
left.set_xlabel("step"), left.set_ylabel("MSE loss"), left.set_yscale("log")
left.set_title("training on the packed batch", fontsize=9)
for name in ("dq", "dk", "dv", "dsinks"):
    right.plot([ratios[name] for _, ratios in history], ".-", label=name)
right.axhline(1.0, color="grey", lw=0.8, ls="--")
right.set_ylim(0, 1.1), right.set_xlabel("step"), right.legend(fontsize=8, ncol=4)
right.set_title("gradient error / FA's allowed error (at most 1)", fontsize=9)
for ax in (left, right):
    ax.spines[["top", "right"]].set_visible(False)
fig.tight_layout()
plt.show()

# %% [markdown]
# The layer learns the running mean: the loss falls by an order of magnitude in 30 steps. The
# attention's gradients stay well inside FlashAttention's rule at every step, while the weights
# move.
#
# Back to the padded shape, the predictions of the trained layer are scattered to `indices` (the
# inverse of the packing), and the padding positions stay zero:

# %%
with torch.no_grad():
    pred, _ = layer(x, cu_seqlens, max_seqlen)
pred_padded = torch.zeros(b * s_max, d_model)
pred_padded[indices] = pred
pred_padded = pred_padded.unflatten(0, (b, s_max))
assert torch.equal(pred_padded[mask], pred) and pred_padded[~mask].abs().max() == 0
error = (pred_padded - y_padded).abs()[mask].mean().item()
print(f"mean |prediction - running mean| over the real tokens: {error:.3f}")

# %% [markdown]
# ## Summary
#
# * Packing: `cu_seqlens = [0, cumsum(lengths)]` and the flat `indices` of the real tokens; each
#   sequence is attended alone, with its own bottom-right causal mask.
# * `attn_ref.flash_attn_varlen_func` is differentiable: q, k, v and the sinks get their gradients
#   from the saved output and LSE, one sequence at a time.
# * At every step those gradients match float64 autograd of `attn_ref.dense.attention` within
#   FlashAttention's rule.
# * `kernels.flash_attn_varlen_func` is the Triton twin, with the same signature: swap it in to run
#   the same loop on the kernels.
