"""Write small GGUF files from the tiny HF checkpoints, the way llama.cpp's converter does.

q/k rows are permuted into llama.cpp's interleaved-rotary order for llama (not for qwen2), so
loading them back through cadence's GGUF loader checks the un-permutation end to end.
"""

from __future__ import annotations

import json
import os

import gguf
import numpy as np
from safetensors.numpy import load_file

_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's permute: HF rotate_half rows -> interleaved pairs."""
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{_LAYER[rest]}"


def write_tiny_gguf(hf_dir: str, out_path: str, arch: str | None = None,
                    tensor_overrides: dict[str, np.ndarray] | None = None,
                    layer_type: gguf.GGMLQuantizationType | None = None) -> str:
    """GGUF (F32 tensors) of an HF tiny checkpoint; `arch` overrides general.architecture;
    `layer_type` stores the layers' matmul weights quantized in that GGML type (Q8_0, Q4_1 ...)."""
    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(hf_dir, "tokenizer.json")) as f:
        tok = json.load(f)
    real_arch = cfg["model_type"]
    writer = gguf.GGUFWriter(out_path, arch or real_arch)
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_vocab_size(cfg["vocab_size"])

    vocab = tok["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {a["content"] for a in tok["added_tokens"] if a["special"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    writer.add_eos_token_id(2)
    writer.add_chat_template(json.load(open(os.path.join(hf_dir, "tokenizer_config.json")))["chat_template"])

    state = load_file(os.path.join(hf_dir, "model.safetensors"))
    if cfg["tie_word_embeddings"]:
        state.pop("lm_head.weight", None)
    for name, array in state.items():
        array = array.astype(np.float32)
        if real_arch == "llama" and ".q_proj." in name:
            array = llama_cpp_permute(array, cfg["num_attention_heads"])
        elif real_arch == "llama" and ".k_proj." in name:
            array = llama_cpp_permute(array, cfg["num_key_value_heads"])
        target = gguf_name(name)
        if tensor_overrides and target in tensor_overrides:
            array = tensor_overrides[target]
        if layer_type is not None and target.startswith("blk.") and array.ndim == 2:
            writer.add_tensor(target, gguf.quants.quantize(array, layer_type), raw_dtype=layer_type)
        else:
            writer.add_tensor(target, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path
