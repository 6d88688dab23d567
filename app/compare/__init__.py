"""Compare drafts side by side: run one main model with several drafters over a prompt set, headless (no Qt)."""
