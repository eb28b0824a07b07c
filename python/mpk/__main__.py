"""`python -m mpk <command>`; commands: check, build, validate-suite."""

from __future__ import annotations

import sys

USAGE = """usage: python -m mpk <command> [options]
  check           compile a model step with mpk and compare it with eager
                  [--model NAME | --config PATH] [--target reference|cuda] [--prefill N] [--seed S]
                  [--workers N] [--cache-tokens N] [--dtype float32|bfloat16] [--steps N]
                  [--batch N] [--mask]
  build           compile for the cuda target without a GPU; write module.cu (and module.so)
                  --out DIR [--model NAME | --config PATH] [--workers N] [--dtype bfloat16|float32]
                  [--prefill N] [--cache-tokens N] [--capacity N] [--batch N] [--mask] [--arch 90a]
  validate-suite  the validator's adversarial mutant suite [--n N] [--seed S]"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "check":
        from . import check
        return check.main(rest)
    if cmd == "build":
        from . import build_cli
        return build_cli.main(rest)
    if cmd == "validate-suite":
        from . import validate_suite
        return validate_suite.main(rest)
    print(f"unknown command {cmd!r}; known: check, build, validate-suite", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
