"""Backends run a GGUF model behind one seam; the loop, drafters and schedule sit above it.

The seam (what app.engine.loop.speculative and the drafters call) is the KV model:
``ids`` (the tokens whose keys/values the cache holds), ``n_ctx``, ``vocab_size``,
``feed_rows(ids, n_logits)`` (append tokens, get the logit rows of the last positions),
``feed``, ``sync(context)``, ``rewind(n)``, ``reset()`` and ``step_cost`` (the schedule's prior).

- ``llamacpp``: llama.cpp through llama-cpp-python's low-level API (llama_batch with logits only
  on the rows asked for, the memory API's seq_rm to roll back); the default wherever it runs.
- torch: app.engine.backends.torch.kv.KVModel over transformers, for CUDA/MPS where the llama.cpp build
  has no GPU, and where llama.cpp cannot run a file or is not installed.
"""

AUTO, LLAMA_CPP, TORCH = "auto", "llama.cpp", "torch"
BACKEND_CHOICES = (AUTO, LLAMA_CPP, TORCH)
