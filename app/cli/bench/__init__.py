"""`specula bench` and its kin: the command (command.py) and its flags (args.py), the prompt set
and one timed reply (common.py), the peers it measures against (llamacpp.py, server.py), the
verdict table (verdict.py), and the other bench commands: bench-ngram (ngram.py), bench-gpu
(gpu.py), bench-pair (pair.py, pair_draft.py), bench-rows (rows.py), bench-busy (busy.py)."""
