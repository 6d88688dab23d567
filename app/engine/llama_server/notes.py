"""Why a reply llama-server drafted was slower than plain decoding, in one line from llama-server's
own counts (its timings' draft_n and draft_n_accepted, read as the reply streamed), as our loop's
schedule says why it declined to draft (app.engine.loop.schedule.declined_note).

llama-server prices nothing: it drafts whenever its --spec-type finds a draft. What the reply
shows is the trade: a verify step that drafted yields its accepted tokens and one of the main
model's own, and costs a main-model step plus the drafting. Against the plain speed of the same
model, the time the drafting steps took is known (the steps that drafted nothing are taken at
plain speed), and so the number of plain tokens a drafting step cost: drafting pays only where a
step yields more tokens than that."""

from __future__ import annotations

SLOWER = 0.95  # below this share of the plain speed a drafted reply is called slower (noise aside)


def server_draft_note(drafter: str, predicted: int, drafted: int, accepted: int, steps: int, tps: float,
                      plain_tps: float | None) -> str | None:
    """The note under a llama-server reply (`drafter`: its label, "llama-server draft-simple"):
    why drafting made it slower than `plain_tps` (this model's plain speed, None where unknown),
    or that its type drafted nothing; None where there is nothing to explain."""
    types = drafter.removeprefix("llama-server").strip()
    if not drafter.startswith("llama-server") or types in ("", "none", "at its URL"):
        return None
    if drafted <= 0:
        why = ("no draft passed its --spec-draft-p-min and --spec-draft-n-min" if "draft-" in types
               else "nothing earlier matched what it was writing")
        return (f"llama-server's {types} drafted nothing in this reply ({why}), so it ran at plain decoding's "
                "speed") if predicted >= 8 else None
    if not plain_tps or tps <= 0 or tps >= SLOWER * plain_tps or steps <= 0:
        return None
    per_step = (accepted + steps) / steps  # each drafting step: its accepted drafts and the main model's own token
    cost = _step_cost(predicted, accepted + steps, steps, tps, plain_tps)
    took = f" and took as long as {cost:.1f} plain ones" if cost is not None and cost > per_step else ""
    return (f"llama-server drafted {drafted} tokens, accepted {accepted} ({accepted / drafted:.0%}): a verify "
            f"step gave {per_step:.1f} tokens ({per_step - 1:.1f} accepted + 1 of the main model's){took} "
            f"({tps:.1f} tok/s against this model's {plain_tps:.1f} plain), so drafting was slower; it pays only "
            "where a step gives more tokens than it costs")


def _step_cost(predicted: int, from_steps: int, steps: int, tps: float, plain_tps: float) -> float | None:
    """Plain tokens' time one drafting step took: the reply's decode time, less its tokens from
    steps that drafted nothing at the plain speed, over the drafting steps (None where noise
    leaves nothing to tell)."""
    decoded = max(predicted - 1, 0)  # the first token comes from the prompt's pass
    plain_tokens = max(decoded - from_steps, 0)
    drafting_s = decoded / tps - plain_tokens / plain_tps
    cost = drafting_s * plain_tps / steps
    return cost if cost > 0 else None
