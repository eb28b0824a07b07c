"""`python -m mpk <command>`; commands: check."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m mpk check [--model NAME] [--target reference|cuda] [--prefill N] "
              "[--seed S] [--workers N] [--cache-tokens N] [--dtype float32|bfloat16] [--steps N]")
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "check":
        from . import check
        return check.main(rest)
    print(f"unknown command {cmd!r}; known: check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
