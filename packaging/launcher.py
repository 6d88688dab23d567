"""The bundle's entry point (packaging/specula.spec): the same `specula` command as the venv's."""

import multiprocessing
import sys

from app.cli import main

if __name__ == "__main__":
    multiprocessing.freeze_support()  # a frozen app must say so before anything spawns a process
    sys.exit(main())
