"""The Model and Library tabs: the pair picker, engine, offload, generation and serve settings, the library."""
