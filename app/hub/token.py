"""The Hugging Face access token: read it as every HF tool does, store one the way `hf auth login` does.

huggingface_hub already sends HF_TOKEN, or else the token saved by its CLI (HF_HOME/token), with
every request; we never handle it ourselves except to save one a user typed in. Saving goes through
huggingface_hub.login(), which checks the token against the hub's whoami and stores it under its
name in HF_HOME/stored_tokens and as the active token. When the hub cannot be reached (offline, or
a mirror without whoami) the token is stored the same way without that check, so a user can set it
up before going online; a token the hub *rejects* is never stored.
"""

from __future__ import annotations

import logging

from huggingface_hub import login
from huggingface_hub import errors as hf_errors

from app.hub.errors import GatedRepoError, HubError, OfflineError, endpoint, translate

log = logging.getLogger(__name__)

UNVERIFIED_NAME = "specula"


def save_token(token: str) -> bool:
    """Store `token` as the active Hugging Face token. Returns True when the hub verified it,
    False when it was stored unverified because the hub could not be reached; raises
    GatedRepoError when the hub rejects it."""
    token = token.strip()
    if not token or any(c.isspace() for c in token):
        raise HubError("that does not look like a token (it is empty or contains spaces)")
    try:
        login(token=token, add_to_git_credential=False)
        log.info("token verified by %s and saved", endpoint())
        return True
    except ValueError as exc:  # login's own refusal (an organization token)
        raise HubError(str(exc).splitlines()[0]) from exc
    except Exception as exc:  # noqa: BLE001 - decide below whether it is "rejected" or "unreachable"
        ours = translate(exc, "check the token")
        if isinstance(ours, GatedRepoError) or (
                isinstance(exc, hf_errors.HfHubHTTPError) and _status(exc) in (401, 403)):
            raise GatedRepoError(f"{endpoint()} rejected this token (invalid or expired); "
                                 f"it was not saved") from exc
        if not isinstance(ours, (OfflineError, HubError)):
            raise
        log.info("cannot verify the token (%s); saving it unverified", ours)
    _store_unverified(token)
    return False


def _status(exc: BaseException) -> int | None:
    return getattr(getattr(exc, "response", None), "status_code", None)


def _store_unverified(token: str) -> None:
    # The same two files `hf auth login` writes, through huggingface_hub's own writers (they
    # set owner-only permissions); login() has no switch to skip its online check.
    from huggingface_hub._login import _set_active_token
    from huggingface_hub.utils._auth import _save_token

    _save_token(token=token, token_name=UNVERIFIED_NAME)
    _set_active_token(token_name=UNVERIFIED_NAME, add_to_git_credential=False)
