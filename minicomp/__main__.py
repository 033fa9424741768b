"""The command line: ``python -m minicomp explain FILE.py [--out report.html]``.

FILE.py defines ``model`` (an ``nn.Module`` or a function) and ``example_inputs`` (a tuple of its
arguments, or one tensor); it runs as a script would, except its ``if __name__ == "__main__":`` part.
The report is printed and written as one HTML page (default: FILE.explain.html in this folder).
"""
from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

from .graphs.options import MODES
from .explain import explain



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minicomp", description="minicomp's command line")
    commands = parser.add_subparsers(dest="command", required=True)
    command = commands.add_parser("explain", help="explain how a model becomes kernels (text and an HTML page)")
    command.add_argument("file", type=Path, help="a Python file that defines `model` and `example_inputs`")
    command.add_argument("--out", type=Path, help="the HTML page to write (default: FILE.explain.html)")
    command.add_argument("--mode", default="default", choices=MODES, help="minicomp.compile's mode")
    args = parser.parse_args(argv)
    model, inputs = load(args.file)
    explanation = explain(model, *inputs, mode=args.mode)
    print(explanation)
    out = explanation.save(args.out or Path(f"{args.file.stem}.explain.html"))
    print(f"wrote {out}")
    return 0


def load(path: Path) -> tuple:
    """``model`` and ``example_inputs`` (as a tuple) from the file at ``path``."""
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)  # its own folder's modules import, as under `python FILE.py`
    try:
        names = runpy.run_path(str(path), run_name="__minicomp_explain__")
    finally:
        sys.path.remove(folder)
    missing = [n for n in ("model", "example_inputs") if n not in names]
    if missing:
        raise SystemExit(f"{path} must define {' and '.join(missing)} (see python -m minicomp explain --help)")
    inputs = names["example_inputs"]
    return names["model"], tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)


if __name__ == "__main__":
    sys.exit(main())
