"""The zoo's model configs: one ``config.json`` per tiny drafter-family model, as a pure function.

Each config shares :data:`_COMMON` (vocab 2048, hidden 128, 4 layers, 4 heads / 2 KV heads) and adds what its
architecture needs (MLA sizes, sliding-window layer types, MoE experts, Gated-DeltaNet layers, MTP layers).
:mod:`kit.zoo.weights` turns a config into the tensor names and shapes vLLM 0.32 loads; :mod:`kit.zoo` writes
both with the shared tokenizer.
"""
from __future__ import annotations

VOCAB_SIZE = 2048
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = (EOS_TOKEN, PAD_TOKEN)  # ids 0 and 1


_COMMON = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-06,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "pad_token_id": 1,
    "tie_word_embeddings": False,
    "use_cache": True,
    "torch_dtype": "float32",
}

SWA_LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
SLIDING_WINDOW = 32
EAGLE3_AUX_LAYER_IDS = [1, 2, 3]


def _deepseek_v3() -> dict:
    c = dict(_COMMON)
    c.update(
        architectures=["DeepseekV3ForCausalLM"],
        model_type="deepseek_v3",
        # MLA: the CPU MLA backends (AMX_MLA, CPU_MLA) only take a 576-wide latent cache,
        # i.e. kv_lora_rank 512 + qk_rope_head_dim 64. q_lora_rank set -> fused q_a/kv_a path.
        q_lora_rank=64,
        kv_lora_rank=512,
        qk_nope_head_dim=32,
        qk_rope_head_dim=64,
        v_head_dim=32,
        head_dim=64,
        num_key_value_heads=4,
        rope_interleave=True,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
        attention_bias=False,
        # MoE fields are required by the config classes, but every layer (and the MTP layer,
        # index 4) is dense because first_k_dense_replace > num_hidden_layers.
        first_k_dense_replace=5,
        moe_layer_freq=1,
        moe_intermediate_size=64,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        norm_topk_prob=True,
        routed_scaling_factor=1.0,
        num_nextn_predict_layers=1,
        # float32 runs on the reference CPU_MLA backend (used on hosts without AMX). On AMX hosts
        # vLLM 0.32 picks AMX_MLA (bf16 only) for any dtype unless the CPU_MLA backend is requested.
    )
    return c


def _llama_swa() -> dict:
    c = dict(_COMMON)
    c.update(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        head_dim=32,
        attention_bias=False,
        mlp_bias=False,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
        layer_types=list(SWA_LAYER_TYPES),
        sliding_window=SLIDING_WINDOW,
    )
    return c


def _llama_swa_eagle3() -> dict:
    c = dict(_COMMON)
    c.update(
        architectures=["LlamaForCausalLMEagle3"],
        model_type="llama",
        num_hidden_layers=1,
        head_dim=32,
        attention_bias=False,
        mlp_bias=False,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
        # Draft-relative: vLLM indexes layer_types with (layer index - target layer count).
        layer_types=["sliding_attention"],
        sliding_window=SLIDING_WINDOW,
        draft_vocab_size=VOCAB_SIZE,  # == target vocab: no d2t/t2d tables in the checkpoint
        target_hidden_size=128,
        eagle_aux_hidden_state_layer_ids=list(EAGLE3_AUX_LAYER_IDS),
        # llama_eagle3.py sizes fc from eagle_config's layer ids (default 3), not the top-level key.
        eagle_config={
            "eagle_aux_hidden_state_layer_ids": list(EAGLE3_AUX_LAYER_IDS),
            "use_aux_hidden_state": True,
        },
    )
    return c


def _glm4_moe() -> dict:
    c = dict(_COMMON)
    c.update(
        architectures=["Glm4MoeForCausalLM"],
        model_type="glm4_moe",
        head_dim=32,
        attention_bias=True,
        use_qk_norm=False,
        partial_rotary_factor=0.5,
        rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": 0.5, "rope_type": "default"},
        first_k_dense_replace=1,  # layer 0 dense; layers 1-3 and the MTP layer (4) MoE
        moe_intermediate_size=64,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=1.0,
        num_nextn_predict_layers=1,
    )
    return c


def _qwen3_5() -> dict:
    c = dict(_COMMON)
    c.update(
        architectures=["Qwen3_5ForCausalLM"],
        model_type="qwen3_5_text",
        head_dim=64,
        attention_bias=False,
        attn_output_gate=True,  # q_proj emits query and gate: 2 * heads * head_dim rows
        # Gated-DeltaNet (linear attention) layers: the CPU GDN kernel wants head dims of 128.
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        linear_conv_kernel_dim=4,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_num_key_heads=1,
        linear_num_value_heads=2,
        rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": 0.25, "rope_type": "default"},
        partial_rotary_factor=0.25,
        mtp_num_hidden_layers=1,
        # vLLM 0.32's CPU GDN kernel asserts bf16 ("CPU GDN attention requires BF16.").
        torch_dtype="bfloat16",
    )
    return c


CONFIGS = {
    "tiny-deepseek-v3": _deepseek_v3,
    "tiny-llama-swa": _llama_swa,
    "tiny-llama-swa-eagle3": _llama_swa_eagle3,
    "tiny-glm4-moe": _glm4_moe,
    "tiny-qwen3_5": _qwen3_5,
}

# Extra files per model (kit.json names the Eagle3 draft of a target).
KIT_META = {"tiny-llama-swa": {"draft_model": "../tiny-llama-swa-eagle3"}}

ZOO = tuple(CONFIGS)


def config(name: str) -> dict:
    return CONFIGS[name]()


def generation_config(cfg: dict) -> dict:
    return {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"],
            "pad_token_id": cfg["pad_token_id"], "do_sample": False}
