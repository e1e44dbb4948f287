"""The zoo's tensor manifests: every tensor name and shape vLLM 0.32's ``load_weights`` reads for a config.

Checkpoint names as the architecture's HF checkpoints spell them (MTP layers as
``model.layers.<num_hidden_layers>.*``; Eagle3 drafts in the EAGLE3 ``midlayer.*`` layout).
:func:`weights_manifest` is what ``weights.json`` holds; :func:`kit.core.models.random_checkpoint` writes seeded
random tensors from it.
"""
from __future__ import annotations


def _mlp(p: str, hidden: int, inter: int) -> dict:
    return {
        f"{p}.gate_proj.weight": [inter, hidden],
        f"{p}.up_proj.weight": [inter, hidden],
        f"{p}.down_proj.weight": [hidden, inter],
    }


def _gqa_attn(p: str, c: dict, in_size: int | None = None, bias: bool = False) -> dict:
    h = c["hidden_size"]
    d = c.get("head_dim") or h // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    t = {
        f"{p}.q_proj.weight": [q, in_size or h],
        f"{p}.k_proj.weight": [kv, in_size or h],
        f"{p}.v_proj.weight": [kv, in_size or h],
        f"{p}.o_proj.weight": [h, q],
    }
    if bias:
        t.update({f"{p}.q_proj.bias": [q], f"{p}.k_proj.bias": [kv], f"{p}.v_proj.bias": [kv]})
    return t


def _mla_attn(p: str, c: dict) -> dict:
    h, n = c["hidden_size"], c["num_attention_heads"]
    nope, rope, v = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    kvl, ql = c["kv_lora_rank"], c.get("q_lora_rank")
    t = {}
    if ql:
        t[f"{p}.q_a_proj.weight"] = [ql, h]
        t[f"{p}.q_a_layernorm.weight"] = [ql]
        t[f"{p}.q_b_proj.weight"] = [n * (nope + rope), ql]
    else:
        t[f"{p}.q_proj.weight"] = [n * (nope + rope), h]
    t[f"{p}.kv_a_proj_with_mqa.weight"] = [kvl + rope, h]
    t[f"{p}.kv_a_layernorm.weight"] = [kvl]
    t[f"{p}.kv_b_proj.weight"] = [n * (nope + v), kvl]
    t[f"{p}.o_proj.weight"] = [h, n * v]
    return t


def _moe(p: str, c: dict) -> dict:
    h, e, mi = c["hidden_size"], c["n_routed_experts"], c["moe_intermediate_size"]
    t = {f"{p}.gate.weight": [e, h], f"{p}.gate.e_score_correction_bias": [e]}
    for i in range(e):
        t.update(_mlp(f"{p}.experts.{i}", h, mi))
    if c.get("n_shared_experts"):
        t.update(_mlp(f"{p}.shared_experts", h, mi * c["n_shared_experts"]))
    return t


def _norms(p: str, h: int) -> dict:
    return {f"{p}.input_layernorm.weight": [h], f"{p}.post_attention_layernorm.weight": [h]}


def _mtp_extra(p: str, c: dict) -> dict:
    """The DeepSeek-V3-style MTP layer's own tensors (beside its decoder block)."""
    h, v = c["hidden_size"], c["vocab_size"]
    return {
        f"{p}.enorm.weight": [h],
        f"{p}.hnorm.weight": [h],
        f"{p}.eh_proj.weight": [h, 2 * h],
        f"{p}.shared_head.norm.weight": [h],
        f"{p}.shared_head.head.weight": [v, h],
        f"{p}.embed_tokens.weight": [v, h],
    }


def _causal_lm_top(c: dict) -> dict:
    h, v = c["hidden_size"], c["vocab_size"]
    t = {"model.embed_tokens.weight": [v, h], "model.norm.weight": [h]}
    if not c.get("tie_word_embeddings"):
        t["lm_head.weight"] = [v, h]
    return t


def _moe_mtp_layers(c: dict, attn) -> dict:
    """Decoder layers then MTP layers of an MoE model (DeepSeek-V3, GLM-4 MoE): ``attn(prefix)`` gives each
    layer's attention tensors; layers from ``first_k_dense_replace`` on (every ``moe_layer_freq``-th) are MoE."""
    t = _causal_lm_top(c)
    n = c["num_hidden_layers"]
    for i in range(n + c.get("num_nextn_predict_layers", 0)):
        p = f"model.layers.{i}"
        t.update(attn(p))
        t.update(_norms(p, c["hidden_size"]))
        moe = c.get("n_routed_experts") and i >= c["first_k_dense_replace"] and i % c.get("moe_layer_freq", 1) == 0
        t.update(_moe(f"{p}.mlp", c) if moe else _mlp(f"{p}.mlp", c["hidden_size"], c["intermediate_size"]))
        if i >= n:
            t.update(_mtp_extra(p, c))
    return t


def _manifest_deepseek_v3(c: dict) -> dict:
    return _moe_mtp_layers(c, lambda p: _mla_attn(f"{p}.self_attn", c))


def _manifest_glm4_moe(c: dict) -> dict:
    d = c["head_dim"]

    def attn(p: str) -> dict:
        t = _gqa_attn(f"{p}.self_attn", c, bias=c["attention_bias"])
        if c.get("use_qk_norm"):
            t.update({f"{p}.self_attn.q_norm.weight": [d], f"{p}.self_attn.k_norm.weight": [d]})
        return t

    return _moe_mtp_layers(c, attn)


def _manifest_llama(c: dict) -> dict:
    t = _causal_lm_top(c)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}"
        t.update(_gqa_attn(f"{p}.self_attn", c, bias=c.get("attention_bias", False)))
        t.update(_mlp(f"{p}.mlp", c["hidden_size"], c["intermediate_size"]))
        t.update(_norms(p, c["hidden_size"]))
    return t


def _manifest_llama_eagle3(c: dict) -> dict:
    """EAGLE3 checkpoint layout (as yuhuili/EAGLE3-LLaMA3.1-Instruct-8B): one ``midlayer`` whose
    q/k/v take [embeds, hidden] (2*hidden), ``fc`` over the aux hidden states, no embed_tokens
    (shared from the target), and no d2t/t2d while draft_vocab_size == vocab_size."""
    assert c["num_hidden_layers"] == 1, "the EAGLE3 midlayer layout has one layer"
    h = c["hidden_size"]
    n_aux = len(c["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    t = {}
    t.update(_gqa_attn("midlayer.self_attn", c, in_size=2 * h, bias=c.get("attention_bias", False)))
    t.update(_mlp("midlayer.mlp", h, c["intermediate_size"]))
    t.update(_norms("midlayer", h))
    t["midlayer.hidden_norm.weight"] = [h]
    t["fc.weight"] = [h, n_aux * c["target_hidden_size"]]
    t["norm.weight"] = [h]
    t["lm_head.weight"] = [c["draft_vocab_size"], h]
    if c["draft_vocab_size"] != c["vocab_size"]:
        raise ValueError("a smaller draft vocab needs integer d2t/t2d tensors, which random_checkpoint cannot write")
    return t


def _qwen3_5_layer(p: str, c: dict, layer_type: str) -> dict:
    h = c["hidden_size"]
    t = {}
    if layer_type == "full_attention":
        d, n, kvh = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
        gate = 2 if c.get("attn_output_gate", True) else 1
        t.update({
            f"{p}.self_attn.q_proj.weight": [gate * n * d, h],
            f"{p}.self_attn.k_proj.weight": [kvh * d, h],
            f"{p}.self_attn.v_proj.weight": [kvh * d, h],
            f"{p}.self_attn.o_proj.weight": [h, n * d],
            f"{p}.self_attn.q_norm.weight": [d],
            f"{p}.self_attn.k_norm.weight": [d],
        })
    else:
        kd, vd = c["linear_key_head_dim"], c["linear_value_head_dim"]
        nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
        key_dim, value_dim = nk * kd, nv * vd
        conv_dim = 2 * key_dim + value_dim
        t.update({
            f"{p}.linear_attn.in_proj_qkv.weight": [conv_dim, h],
            f"{p}.linear_attn.in_proj_z.weight": [value_dim, h],
            f"{p}.linear_attn.in_proj_b.weight": [nv, h],
            f"{p}.linear_attn.in_proj_a.weight": [nv, h],
            f"{p}.linear_attn.conv1d.weight": [conv_dim, 1, c["linear_conv_kernel_dim"]],
            f"{p}.linear_attn.dt_bias": [nv],
            f"{p}.linear_attn.A_log": [nv],
            f"{p}.linear_attn.norm.weight": [vd],
            f"{p}.linear_attn.out_proj.weight": [h, value_dim],
        })
    t.update(_mlp(f"{p}.mlp", h, c["intermediate_size"]))
    t.update(_norms(p, h))
    return t


def _manifest_qwen3_5(c: dict) -> dict:
    """Text-only Qwen3.5 (``model.layers.*``) plus its MTP module under ``mtp.*`` (fc over
    [embeds, hidden], two pre-fc norms, full-attention decoder layers, final norm); the MTP
    module shares the target's embed_tokens and lm_head."""
    h = c["hidden_size"]
    t = _causal_lm_top(c)
    for i, lt in enumerate(c["layer_types"]):
        t.update(_qwen3_5_layer(f"model.layers.{i}", c, lt))
    if c.get("mtp_num_hidden_layers"):
        t.update({
            "mtp.fc.weight": [h, 2 * h],
            "mtp.pre_fc_norm_hidden.weight": [h],
            "mtp.pre_fc_norm_embedding.weight": [h],
            "mtp.norm.weight": [h],
        })
        for i in range(c["mtp_num_hidden_layers"]):
            t.update(_qwen3_5_layer(f"mtp.layers.{i}", c, "full_attention"))
    return t


_MANIFESTS = {
    "DeepseekV3ForCausalLM": _manifest_deepseek_v3,
    "Glm4MoeForCausalLM": _manifest_glm4_moe,
    "LlamaForCausalLM": _manifest_llama,
    "LlamaForCausalLMEagle3": _manifest_llama_eagle3,
    "Qwen3_5ForCausalLM": _manifest_qwen3_5,
}


def weights_manifest(cfg: dict) -> dict:
    """``{"tensors": {name: shape}}`` for a zoo config, names sorted."""
    tensors = _MANIFESTS[cfg["architectures"][0]](cfg)
    return {"tensors": {k: tensors[k] for k in sorted(tensors)}}
