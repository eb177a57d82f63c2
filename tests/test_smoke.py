import torch
import torch.nn.functional as F

import attn_ref


def test_causal_gqa_matches_sdpa():
    torch.manual_seed(0)
    b, sq, h, h_k, d, sk = 2, 3, 4, 2, 16, 10
    q = torch.randn(b, sq, h, d)
    k_cache, v_cache = torch.randn(b, sk, h_k, d), torch.randn(b, sk, h_k, d)
    out = attn_ref.flash_attn_with_kvcache(q, k_cache, v_cache, causal=True)
    mask = torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq)  # bottom-right causal
    k, v = (x.repeat_interleave(h // h_k, dim=2).transpose(1, 2) for x in (k_cache, v_cache))
    expected = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask).transpose(1, 2)
    torch.testing.assert_close(out, expected)
