"""The check both tiny architectures' drafter tests share (tests/test_tinymodel.py, tests/test_tinyqwen.py): vLLM's
draft loop, replayed step by step by :func:`kit.zoo.tiny.decode.draft_tokens`, computes what the batched training
pass computes, for the first draft (``mtp_hidden``) and the second (``mtp_forward_chain``)."""
import torch

from kit.zoo.tiny import decode


def check_replay_matches_training(model, chain_layer, seq: torch.Tensor, positions, atol: float) -> None:
    """``seq`` (1 x L token ids); at each of ``positions`` the replayed drafter's hidden states equal the batched ones."""
    T = seq.shape[1] - 3
    pos = torch.arange(T)
    with torch.no_grad():
        h = model.hidden(seq[:, :T], pos)
        kv: list = []
        mh = model.mtp_hidden(h, seq[:, 1:T + 1], pos, kv_out=kv)
    for p in positions:
        s = seq[0].tolist()
        d, hs = decode.draft_tokens(model, s, p + 1, 1, return_hidden=True)
        assert torch.allclose(hs[0][0, 0], mh[0, p], atol=atol)
        # The first draft made "correct", so the chain sees it as the next token; the causal pass at position p
        # reads nothing after p + 1, so the batched values of the original sequence still hold there.
        s[p + 2] = d[0]
        d, hs = decode.draft_tokens(model, s, p + 1, 2, return_hidden=True)
        with torch.no_grad():
            chain = chain_layer.mtp_forward_chain(model.model.embed_tokens(torch.tensor([s[2:T + 2]])), pos + 1, mh,
                                                  *kv[0])
        assert torch.allclose(hs[1][0, 0], chain[0, p], atol=atol)
