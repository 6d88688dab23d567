"""`specula install-desktop [--prefix DIR] [--uninstall]`: the app in the desktop's menu."""

from __future__ import annotations

import argparse
from pathlib import Path

from app import desktop_entry


def register(sub) -> None:
    parser = sub.add_parser(
        "install-desktop",
        help="add Specula to the desktop's application menu (a .desktop entry and icons)",
        description="Write io.github.specula.Specula.desktop and the icons into DIR (default: "
                    "$XDG_DATA_HOME or ~/.local/share), so the app opens from the menu by double-click. "
                    "--uninstall removes exactly what was written.",
    )
    parser.add_argument("--prefix", metavar="DIR", type=Path, default=None,
                        help="data folder to install into (default: $XDG_DATA_HOME or ~/.local/share)")
    parser.add_argument("--uninstall", action="store_true", help="remove the entry and icons installed there")
    parser.add_argument("--force", action="store_true",
                        help="replace an entry or icon of Specula's name that this command did not write")
    parser.set_defaults(func=cmd_install_desktop)


def cmd_install_desktop(args: argparse.Namespace) -> int:
    prefix = args.prefix.expanduser() if args.prefix else desktop_entry.default_prefix()
    if args.uninstall:
        removed = desktop_entry.uninstall(prefix)
        if not removed:
            print(f"nothing to remove: no Specula entry installed under {prefix}")
        else:
            print(f"removed the Specula entry and icons from {prefix} ({len(removed)} files)")
        return 0
    result = desktop_entry.install(prefix, force=args.force)
    print(f"installed {result.entry}")
    print(f"  runs: {' '.join(result.command)}")
    print(f"  icons: {prefix / 'icons' / 'hicolor'} ({len(result.files) - 1} files)")
    print("remove with: specula install-desktop --uninstall" + (f" --prefix {prefix}" if args.prefix else ""))
    return 0
