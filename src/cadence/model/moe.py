"""The mixture-of-experts MLP (Qwen3-MoE, Mixtral): a router picks each token's top-k experts.

    probs   = softmax(router(x))                  [T, E] float32 (router logits in x's dtype)
    w, idx  = topk(probs, k)                      [T, k]; w / sum(w) with norm_topk_prob
    out[t]  = sum_j w[t, j] * expert_idx[t, j](x[t])

as transformers computes it (Qwen3MoeTopKRouter / MixtralTopKRouter and their Experts modules):
the product w * expert(x) is rounded to x's dtype once, and the experts' contributions are added
in ascending expert order; Qwen3-MoE rounds w to x's dtype first, Mixtral keeps it float32
(ModelConfig.moe_round_routing_weights).

Computation groups the step's tokens by expert: one argsort of the [T * k] choices and one
gather of the rows in that order, then each expert that some token chose runs once on its
slice of them (the expert's GEMMs, the weight multiply into a slice of one buffer), and one
index_add puts the products back; so a decode step runs the k experts its tokens picked,
never all E, and a prompt chunk runs each of its experts as one GEMM over that expert's rows.
(Per chosen expert that is its GEMM calls and one multiply; with a gather and an index_add
per expert instead, benchmarks/moe_bench.py's steps took 10-30% longer: docs/performance.md.) Each expert is a
dense SwiGLU MLP module (llama.LlamaMLP of width moe_intermediate_size), so it computes on
whatever its weights are: float (torch or the packed float32 / int8 / int4 kernels) or the
GGUF file's own blocks (GGUFLinear). The fused decode stacks are dense-only: a model with MoE
layers always takes the per-op path (ModelConfig.stack_computes).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import torch
from torch import nn

from cadence.model.config import ModelConfig


class SparseMoeBlock(nn.Module):
    """Router (`gate`, HF's name: [num_experts, hidden]) and `experts` (HF: experts.E.gate_proj /
    up_proj / down_proj); called like the dense MLP: forward(x), forward_cpu(x, kernels)."""

    def __init__(self, config: ModelConfig, make_expert: Callable[[int], nn.Module]):
        super().__init__()
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = nn.ModuleList(make_expert(config.expert_intermediate_size)
                                     for _ in range(config.num_experts))
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        self.round_weights = config.moe_round_routing_weights

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] -> (routing weights [T, k], float32 or x's dtype; expert ids [T, k] int64)."""
        logits = self.gate(x).to(x.dtype)  # [T, E] (a GGUF router computes in float32)
        probs = torch.softmax(logits.float(), dim=-1)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        if self.round_weights:
            weights = weights.to(x.dtype)
        return weights, experts

    def _mix(self, x: torch.Tensor, run: Callable[[nn.Module, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """x [T, H] -> [T, H]: each chosen expert run once over the rows that chose it."""
        weights, experts = self.route(x)
        choices = experts.reshape(-1)  # [T * k]: slot s is token s // k's (s % k)-th choice
        order = torch.argsort(choices, stable=True)  # slots grouped by expert, ascending
        counts = torch.bincount(choices, minlength=len(self.experts)).tolist()
        tokens = order // self.top_k  # [T * k]: each sorted slot's token
        rows = x.index_select(0, tokens)  # [T * k, H]: every expert's rows side by side
        slot_weights = weights.reshape(-1).index_select(0, order).unsqueeze(1)  # [T * k, 1]
        weighted = torch.empty_like(rows)
        start = 0
        for expert, count in enumerate(counts):
            if not count:
                continue
            end = start + count
            y = run(self.experts[expert], rows[start:end])  # [n, H]
            # w * y computed in the wider of their dtypes, rounded to x's once (HF's product).
            torch.mul(y, slot_weights[start:end], out=weighted[start:end])
            start = end
        # Serial over the sorted slots: each token's experts added in ascending order to 0.
        return torch.zeros_like(x).index_add_(0, tokens, weighted)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The pure-torch path: x [T, H] -> [T, H]."""
        return self._mix(x, lambda expert, rows: expert(rows))

    def forward_cpu(self, x: torch.Tensor, kernels: ModuleType) -> torch.Tensor:
        """The compiled-kernel path (each expert's GEMMs on the kernels): x [T, H] -> [T, H]."""
        return self._mix(x, lambda expert, rows: expert.forward_cpu(rows.contiguous(), kernels))


def layer_mlps(layer: nn.Module) -> list[nn.Module]:
    """The dense MLP modules of a decoder layer: its MLP, or the experts of an MoE layer (the
    modules whose GEMM weights get packed, rounded to a storage format, or GGUF blocks)."""
    mlp = layer.mlp
    return list(mlp.experts) if isinstance(mlp, SparseMoeBlock) else [mlp]
