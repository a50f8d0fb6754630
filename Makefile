# The two commands the README starts with. Both set everything up first (scripts/setup.sh).
.PHONY: setup serve test test-fast bench
export OMP_WAIT_POLICY ?= PASSIVE

setup:
	bash scripts/setup.sh

serve: setup
	.venv/bin/cadence serve

# On a CPU above the AVX2 kernel tier, the float32 fast path's tests run a second time with the
# AVX2 tier forced (CADENCE_ISA=avx2), so that tier is tested on every x86 machine.
AVX2_TIER_TESTS = tests/model/test_fused_decode_f32.py tests/model/test_kernel_tiers.py tests/model/test_gguf_weight.py \
	tests/model/test_families_vs_hf.py tests/engine/test_batch_invariant_default.py \
	tests/model/test_attention_row_invariance.py tests/model/test_batch_invariant_paths.py tests/model/test_gguf_stack.py \
	tests/model/test_kv_cache_16bit.py

test: setup
	.venv/bin/python -m pytest -q tests
	@if [ "$$(.venv/bin/python -c 'from cadence.model.kernels.isa import best_tier; print(best_tier().name)')" != avx2 ] && \
	    .venv/bin/python -c 'import sys; from cadence.model.kernels.isa import tier_by_name, cpu_features; sys.exit(0 if tier_by_name("avx2").features <= cpu_features() else 1)'; then \
	  echo "== the AVX2 kernel tier, forced (CADENCE_ISA=avx2) =="; \
	  CADENCE_ISA=avx2 .venv/bin/python -m pytest -q $(AVX2_TIER_TESTS); \
	fi

test-fast: setup
	.venv/bin/python -m pytest -q tests -m "not slow"
