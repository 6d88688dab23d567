"""The CPU kernels and the choice of plan, apart from the speculative loop and from GGUF loading.

- `layout`: torch's int4 packing layout, learned from its own converter once per process;
- `quantlinear`: linears that keep a GGUF file's low-bit weights and run torch's int4 kernel;
- `screen`: the exact greedy token of an int4 output projection, from a bf16 screen;
- `int8head`: the output projection in int8 (torch's fbgemm), float32 products for the tokens
  that can lead, row-exact;
- `attention`: float32 SDPA over a float32 cache for half-precision CPU loads;
- `rowexact`, `leanstep`: verifies computed as decoding computes them, few-token steps without
  transformers' module tree;
- `plan`: which dtype, weight form and head run fastest on this machine, measured and cached.

The loop only sees "a model that feeds tokens and rewinds its cache" (app.engine.kvmodel).
"""
