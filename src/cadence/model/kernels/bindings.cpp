// Python bindings of the CPU kernels for the decode/prefill fast path (all files in this folder
// are compiled once into one extension by cadence.model.kernels.cpu_ops).
//
// Every kernel works on float32 and bfloat16 tensors (templated on the storage type, computing in
// float32) and parallelises with at::parallel_for, so it follows torch.set_num_threads (of the
// calling thread: OpenMP's thread count is per calling thread). Every tensor kernel releases the
// GIL, so two Python threads (the engine's prefill and decode teams) compute at once.
//
//  paged_attention   one query row per token, attending over its own context [0, ctx_len) read
//                    straight from the paged cache through its block table: no gather, no copy.
//  rope_write_kv     rotate q and k of a fused qkv projection in place (HF rotate_half layout)
//                    and store k, v at their cache slots; with q_norm / k_norm weights, each
//                    head's RMS norm first (Qwen3, Gemma 3).
//  add_rms_norm      residual += x (in the model dtype), out = rms_norm(residual) * weight.
//  rms_norm          out = rms_norm(x) * weight.
//  silu_mul          out = silu(gate) * up of a fused gate/up projection.
//  gelu_tanh_mul     out = gelu_tanh(gate) * up (GeGLU: Gemma), float32.
//  linear_bf16       y = x @ w.T for bf16 with few rows (decode), with AVX512-BF16 dot products;
//                    torch's bf16 GEMM is several times slower than memory bandwidth there.
//  prefill_attention causal bf16 flash attention of a prefill chunk over its context (packed
//                    key blocks, online softmax, causal blocks only; prefill_attention.cpp).
//  prefill_attention_f32
//                    the same in float32 with AVX2 FMA tiles (avx2/prefill_attention_f32.cpp).
//  pack_linear_bf16 / linear_packed_bf16
//                    bf16 GEMM on weights packed once for AVX512-BF16 (packed_gemm.h): the LM
//                    head and, inside DecodeStack, every projection.
//  gguf_linear       float32 x @ W.T on a GGUF weight's own blocks (Q4_K, Q6_K, Q8_0, ...: gguf/).
//  gguf_linear_many  several GGUF weights of one input in one call (q/k/v, gate/up), side by side.
//  argmax_rows       torch.argmax(logits, -1) of float32 rows over both cores (greedy sampling).
//  DecodeStack       every decoder layer of a small bf16 batch in one call (decode_stack.cpp).
//  DecodeStackGGUF   the same for a GGUF-native model, on its blocks (gguf/decode_stack_gguf.cpp).
#include <torch/extension.h>

#include "avx2/decode_stack_f32.h"
#include "decode_stack.h"
#include "gguf/decode_stack_gguf.h"
#include "ops.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // The fused stacks' solo rule (team.h) over a scripted run, for tests: step i runs on the
  // returned team size and reports lost[i] (a thread pushed off its core; ignored on 1 thread).
  m.def("solo_schedule_teams", [](const std::vector<bool>& lost, int threads) {
    cadence_kernels::SoloSchedule schedule;
    std::vector<int> teams;
    for (const bool lost_core : lost) {
      const int team = schedule.team_for_step(threads);
      schedule.after_step(team, lost_core);
      teams.push_back(team);
    }
    return teams;
  }, "team size per step of a SoloSchedule fed the given lost-core flags");
  m.def("paged_attention", &cadence_kernels::paged_attention, py::arg("q"), py::arg("k_cache"), py::arg("v_cache"),
        py::arg("block_tables"), py::arg("row_seq"), py::arg("ctx_lens"), py::arg("scale"), py::arg("window") = 0,
        "paged attention over block tables (no gather); window > 0: the keys of a sliding-window layer only",
        py::call_guard<py::gil_scoped_release>());
  m.def("rope_write_kv", &cadence_kernels::rope_write_kv, py::arg("qkv"), py::arg("cos"), py::arg("sin"),
        py::arg("num_heads"), py::arg("num_kv_heads"), py::arg("k_cache"), py::arg("v_cache"), py::arg("slots"),
        py::arg("q_norm") = py::none(), py::arg("k_norm") = py::none(), py::arg("eps") = 0.0,
        "(per-head q/k RMS norm, then) rotary embedding in place + cache write", py::call_guard<py::gil_scoped_release>());
  m.def("rms_norm", &cadence_kernels::rms_norm, "RMS norm", py::call_guard<py::gil_scoped_release>());
  m.def("add_rms_norm", &cadence_kernels::add_rms_norm, "residual add + RMS norm", py::call_guard<py::gil_scoped_release>());
  m.def("silu_mul", &cadence_kernels::silu_mul, "silu(gate) * up", py::call_guard<py::gil_scoped_release>());
  m.def("gelu_tanh_mul", &cadence_kernels::gelu_tanh_mul, "gelu_tanh(gate) * up (GeGLU)", py::call_guard<py::gil_scoped_release>());
  m.def("linear_bf16", &cadence_kernels::linear_bf16, "bf16 x @ w.T for few rows", py::call_guard<py::gil_scoped_release>());
  m.def("prefill_attention", &cadence_kernels::prefill_attention, "causal bf16 flash attention of a prefill chunk over its context", py::call_guard<py::gil_scoped_release>());
  m.def("prefill_attention_f32", &cadence_kernels::prefill_attention_f32,
        "causal float32 flash attention of a prefill chunk over its context (AVX2 tier)", py::call_guard<py::gil_scoped_release>());
  m.def("argmax_rows", &cadence_kernels::argmax_rows, "first index of each float32 row's maximum (torch.argmax(-1))", py::call_guard<py::gil_scoped_release>());
  m.def("pack_linear_bf16", &cadence_kernels::pack_linear_bf16, "pack a bf16 [N, K] weight for linear_packed_bf16", py::call_guard<py::gil_scoped_release>());
  m.def("linear_packed_bf16", &cadence_kernels::linear_packed_bf16,
        "bf16 x @ w.T on a packed weight; float_out: the bf16-rounded result as float32; "
        "argmax_out ([M] int64, with float_out): filled with each row's torch.argmax",
        py::arg("x"), py::arg("packed"), py::arg("N"), py::arg("bias") = py::none(),
        py::arg("float_out") = false, py::arg("argmax_out") = py::none(), py::call_guard<py::gil_scoped_release>());
  m.def("pack_weight_f32", &cadence_kernels::pack_weight_f32,
        "pack a float32/bf16 [N, K] weight for linear_packed_f32 in format 0 (float32), 1 (bf16), 3 (int4) or "
        "2 (int8, a scale per 16 columns x 32 k); returns (data, scales)",
        py::arg("w"), py::arg("format"), py::arg("interleave_halves") = false, py::call_guard<py::gil_scoped_release>());
  m.def("quantize_activations_q8", &cadence_kernels::quantize_activations_q8,
        "float32 [M, K] rows as the int8 GEMM sees them: quantized per group of 32 k and dequantized", py::call_guard<py::gil_scoped_release>());
  m.def("linear_packed_f32", &cadence_kernels::linear_packed_f32,
        "float32 x @ w.T on a packed compressed weight (+ bias); argmax_out ([M] int64): each row's "
        "torch.argmax",
        py::arg("x"), py::arg("data"), py::arg("scales"), py::arg("format"), py::arg("N"),
        py::arg("bias") = py::none(), py::arg("argmax_out") = py::none(), py::call_guard<py::gil_scoped_release>());
  py::class_<cadence_kernels::DecodeStack>(m, "DecodeStack", py::module_local(),
                                           "every decoder layer of a bf16 model for a small batch in one call")
      .def(py::init<const std::vector<at::Tensor>&, const std::vector<at::Tensor>&,
                    const std::vector<at::Tensor>&, const std::vector<at::Tensor>&,
                    const std::vector<at::Tensor>&, const std::vector<at::Tensor>&,
                    const std::vector<at::Tensor>&, at::Tensor, int64_t, int64_t, double>(),
           py::arg("qkv"), py::arg("qkv_bias"), py::arg("o"), py::arg("gate_up"), py::arg("down"),
           py::arg("input_norm"), py::arg("post_norm"), py::arg("final_norm"), py::arg("num_heads"),
           py::arg("num_kv_heads"), py::arg("eps"))
      .def("forward", &cadence_kernels::DecodeStack::forward, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("num_layers", &cadence_kernels::DecodeStack::num_layers)
      .def("attach_qk_norms", &cadence_kernels::DecodeStack::attach_qk_norms, py::arg("q_norm"),
           py::arg("k_norm"), "per-layer q and k RMS norm weights [head_dim] (Qwen3), applied before rope")
      .def_property_readonly("has_qk_norms", &cadence_kernels::DecodeStack::has_qk_norms)
      .def("phase_seconds", &cadence_kernels::DecodeStack::phase_seconds,
           "last forward: thread 0's seconds per phase (qkv, rope, attention, o, norm, gate_up, down, norm, head)")
      .def_property_readonly("last_team", &cadence_kernels::DecodeStack::last_team);
  m.def("gguf_linear", &cadence_kernels::gguf_linear,
        "float32 x @ W.T (+ bias) on a GGUF weight's blocks as stored, ggml type by id",
        py::arg("x"), py::arg("blocks"), py::arg("type"), py::arg("N"), py::arg("K"), py::arg("bias") = py::none(),
        py::arg("packed") = py::none(), py::call_guard<py::gil_scoped_release>());
  m.def("gguf_linear_many", &cadence_kernels::gguf_linear_many,
        "float32 x @ [W_0; W_1; ...].T (+ biases): several GGUF weights of one input, outputs side by side",
        py::arg("x"), py::arg("blocks"), py::arg("types"), py::arg("Ns"), py::arg("K"), py::arg("biases"),
        py::arg("packed"), py::call_guard<py::gil_scoped_release>());
  m.def("gguf_embedding", &cadence_kernels::gguf_embedding,
        "rows ids of a Q4_K / Q6_K / Q8_0 weight's blocks as float32, gguf-py's dequantized values",
        py::arg("blocks"), py::arg("type"), py::arg("ids"), py::arg("K"), py::call_guard<py::gil_scoped_release>());
  m.def("gguf_repack", &cadence_kernels::gguf_repack,
        "a Q3_K / Q4_K / Q5_K / Q6_K weight's whole octets of columns, 8 columns interleaved (lossless), for gguf_linear's packed",
        py::arg("blocks"), py::arg("type"), py::arg("N"), py::arg("K"), py::call_guard<py::gil_scoped_release>());
  m.def("kernel_tier", &cadence_kernels::kernel_tier, "the instruction-set tier of this build");
  m.def("int8_dot_peak", &cadence_kernels::int8_dot_peak,
        "FLOP/s of the tier's int8 dot-product micro kernel (in registers) on every thread: the quantized GEMMs' compute bound",
        py::arg("iterations") = 4000000, py::call_guard<py::gil_scoped_release>());
  py::class_<cadence_kernels::DecodeStackF32>(m, "DecodeStackF32", py::module_local(),
                                              "every decoder layer in float32 on compressed packed weights, one call")
      .def(py::init<const std::vector<at::Tensor>&, const std::vector<at::Tensor>&,
                    const std::vector<at::Tensor>&, const std::vector<at::Tensor>&,
                    const std::vector<at::Tensor>&, const std::vector<at::Tensor>&,
                    const std::vector<at::Tensor>&, at::Tensor, int64_t, int64_t, double, int64_t>(),
           py::arg("qkv"), py::arg("qkv_bias"), py::arg("o"), py::arg("gate_up"), py::arg("down"),
           py::arg("input_norm"), py::arg("post_norm"), py::arg("final_norm"), py::arg("num_heads"),
           py::arg("num_kv_heads"), py::arg("eps"), py::arg("format"))
      .def("forward", &cadence_kernels::DecodeStackF32::forward, py::arg("x"), py::arg("cos"), py::arg("sin"),
           py::arg("kv"), py::arg("slots"), py::arg("block_tables"), py::arg("row_seq"), py::arg("ctx_lens"),
           py::arg("scale"), py::arg("logits") = py::none(), py::arg("argmax") = py::none(),
           py::call_guard<py::gil_scoped_release>())
      .def("attach_head", &cadence_kernels::DecodeStackF32::attach_head, py::arg("data"), py::arg("scales"),
           py::arg("format"), py::arg("N"),
           "the packed LM head [N, H] (linear_packed_f32's data, scales, format) that forward's `logits` runs "
           "in the same parallel region")
      .def_property_readonly("head_size", &cadence_kernels::DecodeStackF32::head_size)
      .def("new_logits", &cadence_kernels::DecodeStackF32::new_logits, py::arg("T"),
           "an uninitialised [T, head_size] float32 tensor for forward's logits, on pages reused between steps")
      .def_property_readonly("num_layers", &cadence_kernels::DecodeStackF32::num_layers)
      .def("attach_qk_norms", &cadence_kernels::DecodeStackF32::attach_qk_norms, py::arg("q_norm"),
           py::arg("k_norm"), "per-layer q and k RMS norm weights [head_dim] (Qwen3), applied before rope")
      .def_property_readonly("has_qk_norms", &cadence_kernels::DecodeStackF32::has_qk_norms)
      .def_property_readonly("weight_format", &cadence_kernels::DecodeStackF32::weight_format)
      .def_property_readonly("weight_bytes", &cadence_kernels::DecodeStackF32::weight_bytes)
      .def("phase_seconds", &cadence_kernels::DecodeStackF32::phase_seconds,
           "last forward: thread 0's seconds per phase (qkv, rope, attention, o, norm, gate_up, down, norm, head)")
      .def_property_readonly("last_team", &cadence_kernels::DecodeStackF32::last_team)
      .def("packed_layer", &cadence_kernels::DecodeStackF32::packed_layer,
           "layer l's packed [qkv data, scales, o ..., gate_up (halves interleaved by 16) ..., down ...]");
  py::class_<cadence_kernels::DecodeStackGGUF>(m, "DecodeStackGGUF", py::module_local(),
                                               "every decoder layer of a GGUF-native model on its own blocks, one call")
      .def(py::init<const std::vector<at::Tensor>&, const std::vector<int64_t>&,
                    const std::vector<c10::optional<at::Tensor>>&, const std::vector<c10::optional<at::Tensor>>&,
                    const std::vector<at::Tensor>&, const std::vector<at::Tensor>&, at::Tensor, int64_t, int64_t,
                    int64_t, int64_t, double>(),
           py::arg("blocks"), py::arg("types"), py::arg("packed"), py::arg("biases"), py::arg("input_norm"),
           py::arg("post_norm"), py::arg("final_norm"), py::arg("num_heads"), py::arg("num_kv_heads"),
           py::arg("head_dim"), py::arg("intermediate"), py::arg("eps"))
      .def("attach_head", &cadence_kernels::DecodeStackGGUF::attach_head, py::arg("blocks"), py::arg("type"),
           py::arg("packed"), py::arg("bias"), py::arg("N"),
           "the LM head [N, H] that forward's `logits` runs in the same parallel region")
      .def("attach_qk_norms", &cadence_kernels::DecodeStackGGUF::attach_qk_norms, py::arg("q_norm"),
           py::arg("k_norm"), "per-layer q and k RMS norm weights [head_dim] (Qwen3), applied before rope")
      .def_property_readonly("has_qk_norms", &cadence_kernels::DecodeStackGGUF::has_qk_norms)
      .def_property_readonly("head_size", &cadence_kernels::DecodeStackGGUF::head_size)
      .def("new_logits", &cadence_kernels::DecodeStackGGUF::new_logits, py::arg("T"),
           "an uninitialised [T, head_size] float32 tensor for forward's logits, on pages reused between steps")
      .def("forward", &cadence_kernels::DecodeStackGGUF::forward, py::arg("x"), py::arg("cos"), py::arg("sin"),
           py::arg("kv"), py::arg("slots"), py::arg("block_tables"), py::arg("row_seq"), py::arg("ctx_lens"),
           py::arg("scale"), py::arg("logits") = py::none(), py::arg("argmax") = py::none(),
           py::arg("cos_local") = py::none(), py::arg("sin_local") = py::none(),
           py::call_guard<py::gil_scoped_release>())
      .def("attach_sandwich_norms", &cadence_kernels::DecodeStackGGUF::attach_sandwich_norms, py::arg("attn_out"),
           py::arg("mlp_out"), "per-layer norms [H] of the attention and MLP outputs (Gemma's sandwich norms)")
      .def("use_gelu_tanh", &cadence_kernels::DecodeStackGGUF::use_gelu_tanh, "GeGLU (gelu_tanh) MLPs instead of SwiGLU")
      .def("set_layer_attention", &cadence_kernels::DecodeStackGGUF::set_layer_attention, py::arg("windows"),
           py::arg("local_rope"), "per-layer attention window (0 = full) and whether it rotates with cos_local")
      .def_property_readonly("num_layers", &cadence_kernels::DecodeStackGGUF::num_layers)
      .def_property_readonly("weight_bytes", &cadence_kernels::DecodeStackGGUF::weight_bytes)
      .def("phase_seconds", &cadence_kernels::DecodeStackGGUF::phase_seconds,
           "last forward: thread 0's seconds per phase (qkv, rope, attention, o, norm, gate_up, down, norm, head)")
      .def("thread_seconds", &cadence_kernels::DecodeStackGGUF::thread_seconds,
           "last forward, per thread: (start after thread 0, [seconds per phase], [of which at barriers])")
      .def("thread_parts", &cadence_kernels::DecodeStackGGUF::thread_parts, py::arg("threads"),
           "the GEMV phases' part bounds (threads + 1 fractions) the next step on that many threads takes")
      .def_property_readonly("last_team", &cadence_kernels::DecodeStackGGUF::last_team);
  m.def("has_avx512bf16", &cadence_kernels::has_avx512bf16, "whether linear_bf16 is compiled in");
}
