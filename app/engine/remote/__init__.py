"""A server at a URL that speaks OpenAI's API (vLLM, SGLang, Ollama, LM Studio, another Specula,
llama-server too): its streamed chat or text completions as our loop's events, and its Prometheus
/metrics read before and after a reply for the drafted and accepted counts it exports. Standard
library HTTP and a linear parser of Prometheus's text format of our own; no Qt, no torch."""
