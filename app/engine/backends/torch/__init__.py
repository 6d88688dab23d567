"""The torch fallback: transformers' models behind the seam, for CUDA/MPS where the llama.cpp build
has no GPU, and where llama.cpp cannot run a file or is not installed.

kv (KVModel: the seam), load (GGUF -> model and tokenizer on a device plan), fastload (our fast
GGUF path), device (plans), rope (Llama 3.x rope scaling), bpe_form (tokenizer cache form).
Modules here `import torch` absolutely: this package is app.engine.backends.torch, never `torch`.
"""
