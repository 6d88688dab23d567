"""The speculative loop: draft, verify, accept, roll back; the draft-length schedule, sampling,
chat prompts, and the records generation yields."""
