"""`specula serve`: an OpenAI-compatible HTTP server on the engine (Starlette + uvicorn). No Qt."""
