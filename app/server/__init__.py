"""`specula serve`: an OpenAI-compatible HTTP server on the engine (Starlette + uvicorn). No Qt.

Starlette is the small, well-kept ASGI toolkit under FastAPI (routing, JSON and streaming
responses) and uvicorn its standard server; the handful of endpoints here needs no schema or
dependency-injection layer on top, so there is no FastAPI/pydantic.

    params        request JSON -> checked GenerationRequest (OpenAI-style 400s)
    model         ServedModel: names, prompts (chat template), per-request settings, generation
    worker        one generation at a time on a thread, a bounded wait queue (503 when full)
    openai_format response bodies and stream chunks, llama-server's `timings`
    app           the Starlette app: endpoints, API key, origin and content type, body limits, disconnect -> cancel
    origin        which web pages (Origin) may use the server, CORS and preflights
    launch        safe binding (loopback unless a key is set), header deadline, running uvicorn
    stats         counters for /metrics
"""
