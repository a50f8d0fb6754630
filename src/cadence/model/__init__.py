"""cadence.model: the Llama-family model over a paged KV cache, its weights and its tokenizer.

- config.py: ModelConfig (frozen shape of the network)
- tokenizer.py, gguf_tokenizer.py, chat_template.py, detokenizer.py: text <-> ids, streaming
- kv_cache.py, attention_metadata.py, attention.py, rope.py, llama.py: the forward pass
- loader.py (gguf_loader.py, hf_loader.py, weights.py): load_model -> LoadedModel
"""
