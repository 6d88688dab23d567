"""What is on the hub, in one import for the window and the command line.

The work is done in repos (search, file listing), remote (header facts by range reads), fit
(memory check) and drafts (draft suggestions); this module only gathers their public names.
"""

from app.hub.drafts import DraftSuggestion, check_remote_pair, suggest_drafts
from app.hub.fit import FitResult, fits_this_machine
from app.hub.remote import RemoteHeader, fetch_remote_header, fetch_remote_info
from app.hub.repos import SORTS, GGUFModelFile, RepoResult, group_by_quant, list_gguf_files, search_gguf

__all__ = [
    "RepoResult", "GGUFModelFile", "search_gguf", "list_gguf_files", "group_by_quant", "SORTS",
    "fetch_remote_info", "fetch_remote_header", "RemoteHeader", "fits_this_machine", "FitResult",
    "suggest_drafts", "DraftSuggestion", "check_remote_pair",
]
