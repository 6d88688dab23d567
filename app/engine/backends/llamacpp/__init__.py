"""llama.cpp through llama-cpp-python's low-level API: the default backend wherever it runs.

kv (LlamaWeights, LlamaKV: the seam), load (GGUF -> weights, tokenizer and plan), lib (the
binding and its libraries), probe (the self-test in a child process), cost (measured step
costs), threads (the thread pool), tokenizer. Importing this package imports none of them.
"""
