"""Errors of the hub layer, and the one place that turns huggingface_hub's exceptions into them.

Every error is a SpeculaError with a one-line message that says what failed and what to do about
it; `hub_call(...)` wraps each call into huggingface_hub so no library traceback reaches a user.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterator
from contextlib import contextmanager

import httpx2
from huggingface_hub import constants
from huggingface_hub import errors as hf_errors

from app.engine.errors import SpeculaError

log = logging.getLogger(__name__)

TOKEN_HINT = "set HF_TOKEN, run `specula hub login` or `hf auth login`"


class HubError(SpeculaError):
    """The hub answered with an error, or could not be used."""


class OfflineError(HubError):
    """Offline mode is on, or the hub cannot be reached. The local library still works."""


class GatedRepoError(HubError):
    """401/403: the repository is gated or private and needs (another) token."""


class NotFoundError(HubError):
    """No such repository, revision or file."""


class DownloadCancelled(HubError):
    """The user cancelled a download; its partial file is kept so the next attempt resumes."""


class DownloadInterrupted(HubError):
    """The transfer failed part-way; its partial file is kept so the next attempt resumes."""


class DiskFullError(HubError):
    """Not enough free disk space for the download (checked before starting)."""


class ChecksumError(HubError):
    """The downloaded file does not match the hub's SHA-256; it was deleted."""


def endpoint() -> str:
    """The hub in use: HF_ENDPOINT as huggingface_hub read it (its constants are the truth)."""
    return constants.ENDPOINT


def offline_message(what: str) -> str:
    return f"offline (HF_HUB_OFFLINE is set): cannot {what}; the local library still works"


def check_online(what: str) -> None:
    if constants.is_offline_mode():
        raise OfflineError(offline_message(what))


def _status(exc: hf_errors.HfHubHTTPError) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def translate(exc: BaseException, what: str, repo_id: str | None = None,
              filename: str | None = None) -> HubError | None:
    """Our error for a huggingface_hub / httpx2 / OS exception, or None when it is none of those."""
    repo = repo_id or "the repository"
    page = f"{endpoint()}/{repo_id}" if repo_id else endpoint()
    if isinstance(exc, HubError):
        return exc
    if isinstance(exc, hf_errors.OfflineModeIsEnabled):
        return OfflineError(offline_message(what))
    if isinstance(exc, hf_errors.GatedRepoError):
        if _status(exc) == 403:
            return GatedRepoError(f"{repo} is gated and this token has no access: accept its terms at "
                                  f"{page}, then try again")
        return GatedRepoError(f"{repo} is gated: accept its terms at {page} and give a token ({TOKEN_HINT})")
    if isinstance(exc, hf_errors.RemoteEntryNotFoundError):
        return NotFoundError(f"{repo} has no file {filename}" if filename else f"not found: {what}")
    if isinstance(exc, hf_errors.RevisionNotFoundError):
        return NotFoundError(f"{repo} has no such revision")
    if isinstance(exc, hf_errors.RepositoryNotFoundError):
        return NotFoundError(f"no repository {repo} on {endpoint()} (if it is private, {TOKEN_HINT})")
    if isinstance(exc, hf_errors.HfHubHTTPError):
        return _http_error(exc, what, repo)
    if isinstance(exc, hf_errors.LocalEntryNotFoundError):
        cause = exc.__cause__
        found = translate(cause, what, repo_id, filename) if cause is not None else None
        return found or OfflineError(f"cannot reach {endpoint()} to {what}, and it is not in the cache")
    if isinstance(exc, hf_errors.FileMetadataError):
        return HubError(f"{endpoint()} does not answer like a Hugging Face hub while trying to {what}")
    if isinstance(exc, (httpx2.ConnectError, httpx2.ConnectTimeout)):
        return OfflineError(f"cannot reach {endpoint()} to {what} (offline?); the local library still works")
    if isinstance(exc, httpx2.TimeoutException):
        return HubError(f"{endpoint()} did not answer in time while trying to {what}; try again")
    if isinstance(exc, (httpx2.TransportError, httpx2.TooManyRedirects)):
        return HubError(f"connection to {endpoint()} failed while trying to {what} "
                        f"({type(exc).__name__}); try again")
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return DiskFullError(f"disk full while trying to {what}; free some space and try again")
    if isinstance(exc, (ValueError, KeyError, TypeError, AttributeError)):
        # A JSON answer that is not what the hub sends: huggingface_hub's own parsing of a field
        # of the wrong type raises any of these (a number where a date goes: AttributeError).
        first = _shown_first_line(exc)
        return HubError(f"{endpoint()} sent an unexpected answer while trying to {what} "
                        f"({type(exc).__name__}: {first})")
    return None


def _http_error(exc: hf_errors.HfHubHTTPError, what: str, repo: str) -> HubError:
    status = _status(exc)
    if status == 401:
        return GatedRepoError(f"{endpoint()} refused the token (401) while trying to {what}: "
                              f"give a valid token ({TOKEN_HINT})")
    if status == 403:
        return GatedRepoError(f"access to {repo} denied (403): accept its terms at {endpoint()}/{repo} "
                              f"or use a token with access ({TOKEN_HINT})")
    if status is not None and status >= 500:
        return HubError(f"{endpoint()} answered {status} (server error) while trying to {what}; "
                        f"try again later")
    return HubError(f"{endpoint()} answered {status} while trying to {what}")


@contextmanager
def hub_call(what: str, repo_id: str | None = None, filename: str | None = None) -> Iterator[None]:
    """Run a block of huggingface_hub calls; their failures leave it as one-line HubErrors."""
    try:
        yield
    except SpeculaError:
        raise
    except Exception as exc:  # noqa: BLE001 - every library failure must become one line
        ours = translate(exc, what, repo_id, filename)
        if ours is None:
            raise
        log.info("%s failed: %r", what, exc)
        raise ours from exc


def _shown_first_line(exc: BaseException) -> str:
    from app.hub.fields import shown

    text = str(exc)
    return shown(text.splitlines()[0][:200]) if text else ""
