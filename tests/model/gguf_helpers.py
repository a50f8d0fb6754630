"""Write small GGUF files from tiny HF checkpoints the way llama.cpp's converter does.

Mirrors convert_hf_to_gguf.py (its conversion/ package) for each family cadence serves, so that
loading the file back through cadence's GGUF loader checks the whole mapping end to end:
- tensor names through gguf-py's TensorNameMap (the converter's own map_tensor_name);
- q/k rows permuted into llama.cpp's interleaved-rotary order for llama and smollm3 (LlamaModel);
- Gemma norms written as 1 + w, Gemma's lm_head skipped (tied);
- Phi-3's fused qkv_proj / gate_up_proj kept fused (attn_qkv, ffn_up);
- the metadata keys each model class writes (TextModel.set_gguf_parameters, LlamaModel's vocab
  size and rope dimension count, Gemma2/Gemma3/Phi3's own sets), Llama 3 rope scaling as the
  rope_freqs tensor and Phi-3 longrope as rope_factors_long/short tensors.
The vocabulary is the tiny byte-level BPE (tokenizer.json), written as a "gpt2" tokenizer.
"""

from __future__ import annotations

import json
import math
import os
import re

import gguf
import numpy as np
from safetensors.numpy import load_file

# HF model_type -> GGUF architecture (the converter writes Mistral as llama).
GGUF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
             "gemma2": "gemma2", "gemma3_text": "gemma3", "gemma3": "gemma3", "phi3": "phi3",
             "smollm3": "smollm3", "qwen3_moe": "qwen3moe", "mixtral": "llama"}
# Per-expert HF tensors (Qwen3-MoE's mlp.experts.E.gate_proj, Mixtral's block_sparse_moe.experts.E.w1)
# that the converter stacks into one 3-D tensor per projection (Qwen2MoeModel / LlamaModel
# modify_tensors), under the merged name its TensorNameMap knows.
_EXPERT_RE = re.compile(r"^model\.layers\.(\d+)\.(mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight$")
_PERMUTED = ("llama", "smollm3")


def llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's permute: HF rotate_half rows -> interleaved pairs."""
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def _llama3_rope_freqs(rope: dict, dim: int) -> np.ndarray:
    # LlamaModel.generate_extra_tensors, in the converter's float32 / float64 mix.
    import torch

    base = rope.get("rope_theta", 10000.0)
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor = rope.get("factor", 8.0)
    low, high = rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old = rope.get("original_max_position_embeddings", 8192)
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray([float(v) for v in out], dtype=np.float32)


def _rope_params(cfg: dict) -> dict:
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    return params


def _write_text_model_keys(writer: gguf.GGUFWriter, cfg: dict) -> None:
    """TextModel.set_gguf_parameters (llama, qwen2, qwen3, smollm3, and gemma3 before its own)."""
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    params = _rope_params(cfg)
    rope = params.get("full_attention", params)
    rope_type = rope.get("rope_type")
    if rope_type == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    elif rope_type == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        for key, add in (("attention_factor", writer.add_rope_scaling_yarn_attn_factor),
                         ("beta_fast", writer.add_rope_scaling_yarn_beta_fast),
                         ("beta_slow", writer.add_rope_scaling_yarn_beta_slow)):
            if rope.get(key) is not None:
                add(rope[key])
    if rope.get("rope_theta") is not None:
        writer.add_rope_freq_base(rope["rope_theta"])
    if (local := params.get("sliding_attention", {}).get("rope_theta")) is not None:
        writer.add_rope_freq_base_swa(local)
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if cfg.get("head_dim") is not None:
        writer.add_key_length(cfg["head_dim"])
        writer.add_value_length(cfg["head_dim"])


def _write_expert_keys(writer: gguf.GGUFWriter, cfg: dict) -> None:
    """TextModel.set_gguf_parameters' expert counts, Qwen2MoeModel's expert width."""
    experts = cfg.get("num_local_experts") or cfg.get("num_experts")
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(cfg["num_experts_per_tok"])
    if cfg.get("moe_intermediate_size") is not None:
        writer.add_expert_feed_forward_length(cfg["moe_intermediate_size"])


def _merged_experts(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The converter's merge: every expert's projection stacked [E, N, K] under the merged HF
    name (qwen: model.layers.B.mlp.experts.gate_proj.weight; mixtral: layers.B.feed_forward.experts.w1.weight)."""
    groups: dict[str, dict[int, np.ndarray]] = {}
    for name in [n for n in state if _EXPERT_RE.match(n)]:
        layer, kind, expert, proj = _EXPERT_RE.match(name).groups()
        merged = (f"model.layers.{layer}.mlp.experts.{proj}.weight" if kind == "mlp"
                  else f"layers.{layer}.feed_forward.experts.{proj}.weight")
        groups.setdefault(merged, {})[int(expert)] = state.pop(name)
    return {merged: np.stack([parts[e] for e in sorted(parts)]) for merged, parts in groups.items()}


def _write_arch_keys(writer: gguf.GGUFWriter, arch: str, cfg: dict) -> None:
    if arch in ("llama", "smollm3", "qwen2", "qwen3", "qwen3moe"):
        _write_text_model_keys(writer, cfg)
        _write_expert_keys(writer, cfg)
        if arch in ("llama", "smollm3"):  # LlamaModel.set_gguf_parameters
            writer.add_vocab_size(cfg["vocab_size"])
            writer.add_rope_dimension_count(cfg.get("head_dim") or
                                            cfg["hidden_size"] // cfg["num_attention_heads"])
        if cfg["model_type"] == "mistral" and cfg.get("sliding_window"):
            # Not what the converter writes (its Mistral files lose the window, and llama.cpp
            # runs them with full attention): the key a file that keeps it carries.
            writer.add_sliding_window(cfg["sliding_window"])
    elif arch == "gemma2":  # Gemma2Model.set_gguf_parameters (no rope keys)
        writer.add_context_length(cfg["max_position_embeddings"])
        writer.add_embedding_length(cfg["hidden_size"])
        writer.add_block_count(cfg["num_hidden_layers"])
        writer.add_feed_forward_length(cfg["intermediate_size"])
        writer.add_head_count(cfg["num_attention_heads"])
        writer.add_head_count_kv(cfg["num_key_value_heads"])
        writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
        writer.add_key_length(cfg["head_dim"])
        writer.add_value_length(cfg["head_dim"])
        if cfg.get("attn_logit_softcapping"):  # the converter writes it; a test model may have none
            writer.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        writer.add_final_logit_softcapping(cfg["final_logit_softcapping"])
        writer.add_sliding_window(cfg["sliding_window"])
    elif arch == "gemma3":  # Gemma3Model.set_gguf_parameters after TextModel's
        _write_text_model_keys(writer, cfg)
        if cfg.get("final_logit_softcapping"):
            writer.add_final_logit_softcapping(cfg["final_logit_softcapping"])
        if cfg.get("sliding_window_pattern") != 1:
            writer.add_sliding_window(cfg["sliding_window"])
    elif arch == "phi3":  # Phi3MiniModel.set_gguf_parameters
        rope = _rope_params(cfg)
        n_embd, n_head = cfg["hidden_size"], cfg["num_attention_heads"]
        original = cfg.get("original_max_position_embeddings") or rope["original_max_position_embeddings"]
        writer.add_context_length(cfg["max_position_embeddings"])
        writer.add_rope_scaling_orig_ctx_len(original)
        writer.add_embedding_length(n_embd)
        writer.add_feed_forward_length(cfg["intermediate_size"])
        writer.add_block_count(cfg["num_hidden_layers"])
        writer.add_head_count(n_head)
        writer.add_head_count_kv(cfg["num_key_value_heads"])
        writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
        writer.add_rope_dimension_count(int(rope.get("partial_rotary_factor", 1.0) * n_embd) // n_head)
        writer.add_rope_freq_base(rope["rope_theta"])
        writer.add_sliding_window(cfg.get("sliding_window") or 0)
        if rope.get("long_factor"):
            scale = cfg["max_position_embeddings"] / original
            writer.add_rope_scaling_attn_factors(
                math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1.0 else 1.0)
    else:
        raise ValueError(f"no GGUF writer for {arch!r}")


def _extra_tensors(arch: str, cfg: dict) -> dict[str, np.ndarray]:
    """generate_extra_tensors: llama3 rope factors, Phi-3 longrope factors."""
    rope = _rope_params(cfg)
    if arch in ("llama", "smollm3") and rope.get("rope_type") == "llama3":
        dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        return {"rope_freqs.weight": _llama3_rope_freqs(rope, dim)}
    if arch == "phi3" and rope.get("long_factor"):
        return {"rope_factors_long.weight": np.asarray(rope["long_factor"], dtype=np.float32),
                "rope_factors_short.weight": np.asarray(rope["short_factor"], dtype=np.float32)}
    return {}


def _write_bpe_vocab(writer: gguf.GGUFWriter, hf_dir: str, pre: str) -> None:
    with open(os.path.join(hf_dir, "tokenizer.json")) as f:
        tok = json.load(f)
    vocab = tok["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {a["content"] for a in tok["added_tokens"] if a["special"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    writer.add_eos_token_id(2)
    with open(os.path.join(hf_dir, "tokenizer_config.json")) as f:
        writer.add_chat_template(json.load(f)["chat_template"])


def write_tiny_gguf(hf_dir: str, out_path: str, arch: str | None = None,
                    tensor_overrides: dict[str, np.ndarray] | None = None,
                    layer_type: gguf.GGMLQuantizationType | None = None, pre: str = "gpt2",
                    raw_tensors: dict[str, tuple[np.ndarray, gguf.GGMLQuantizationType]] | None = None,
                    fuse_gate_up_exps: bool = False) -> str:
    """GGUF (F32 tensors) of an HF tiny checkpoint of any family; `arch` overrides
    general.architecture (the file is otherwise written for the real one); `layer_type` stores
    the layers' matmul weights quantized in that GGML type (Q8_0, Q4_1 ...; MoE routers stay
    F32, as llama-quantize keeps them); `raw_tensors` replaces tensors by already-encoded
    blocks of a type (e.g. random valid Q4_K ones, which gguf-py cannot quantize);
    `fuse_gate_up_exps` writes MoE gate and up experts as one ffn_gate_up_exps tensor (the
    converter's --fuse-gate-up-exps)."""
    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    real_arch = GGUF_ARCH[cfg["model_type"]]
    writer = gguf.GGUFWriter(out_path, arch or real_arch)
    _write_arch_keys(writer, real_arch, cfg)
    _write_bpe_vocab(writer, hf_dir, pre)

    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[real_arch.upper()], cfg["num_hidden_layers"])
    gemma = real_arch.startswith("gemma")
    state = load_file(os.path.join(hf_dir, "model.safetensors"))
    if cfg.get("tie_word_embeddings", gemma) or gemma:
        state.pop("lm_head.weight", None)
    state.update(_merged_experts(state))
    tensors = {}
    for name, array in state.items():
        array = array.astype(np.float32)
        if real_arch in _PERMUTED and name.endswith(("q_proj.weight", "q_proj.bias")):
            array = llama_cpp_permute(array, n_head)
        elif real_arch in _PERMUTED and name.endswith(("k_proj.weight", "k_proj.bias")):
            array = llama_cpp_permute(array, n_kv)
        if gemma and name.endswith("norm.weight"):
            array = array + 1
        target = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if target is None:
            raise ValueError(f"the converter has no GGUF name for {name!r}")
        tensors[target] = array
    tensors.update(_extra_tensors(real_arch, cfg))
    if fuse_gate_up_exps:
        for gate in [t for t in tensors if t.endswith(".ffn_gate_exps.weight")]:
            up = gate.replace("ffn_gate_exps", "ffn_up_exps")
            fused = np.concatenate([tensors.pop(gate), tensors.pop(up)], axis=1)  # [E, 2I, H]
            tensors[gate.replace("ffn_gate_exps", "ffn_gate_up_exps")] = fused
    for target, array in tensors.items():
        if tensor_overrides and target in tensor_overrides:
            array = tensor_overrides[target]
        if raw_tensors and target in raw_tensors:
            blocks, qtype = raw_tensors[target]
            writer.add_tensor(target, blocks, raw_dtype=qtype)
        elif (layer_type is not None and target.startswith("blk.") and array.ndim >= 2
                and not target.endswith("ffn_gate_inp.weight")):
            writer.add_tensor(target, gguf.quants.quantize(array, layer_type), raw_dtype=layer_type)
        else:
            writer.add_tensor(target, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path
