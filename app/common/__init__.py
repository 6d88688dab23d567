"""What every layer shares and that depends on no part of Specula: files written whole and kept
private (atomic.py), facts about this machine (machine.py), where an installed package's files
are (installed.py). The engine, the hub, the command line and the window all import it; it
imports none of them."""
