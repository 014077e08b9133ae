"""The `kvlib` command: check your progress, and (for maintainers) rebuild the learner release.

  kvlib check [ID|NN] [--json]   one row per exercise: id, title, notebook, status, message
  kvlib course release [--check] regenerate kvlib/ stubs and notebooks/ from solutions/
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import textwrap


def _table(results) -> str:
    width = shutil.get_terminal_size((100, 20)).columns
    head = f"{'id':<5} {'status':<6} {'notebook':<14} {'title':<26} message"
    lines = [head, "-" * min(width, 100)]
    indent = " " * 53
    for r in results:
        msg = textwrap.wrap(r.message, max(30, width - len(indent))) or [""]
        lines.append(f"{r.id:<5} {r.status:<6} {r.notebook:<14} {r.title[:26]:<26} {msg[0]}")
        lines += [indent + m for m in msg[1:]]
    done = sum(r.status == "pass" for r in results)
    lines.append(f"\n{done} of {len(results)} exercises pass" + (" (reference mode: KVLIB_SOLUTIONS is on)" if _reference_mode() else ""))
    return "\n".join(lines)


def _reference_mode() -> bool:
    from kvlib._exercise import solutions_enabled

    return solutions_enabled()


def cmd_check(args) -> int:
    from kvlib import checks

    try:
        results = checks.run(args.selector, seed=args.seed)
    except ValueError as err:
        print(f"kvlib check: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([r.as_dict() for r in results], ensure_ascii=False, indent=1))
    else:
        print(_table(results))
    return 0 if all(r.status == "pass" for r in results) else 1


def cmd_course_release(args) -> int:
    from kvlib import course

    problems = course.release(check=args.check)
    if problems:
        print("\n".join(problems))
        if args.check:
            print("\nthe learner release is out of date: run `kvlib course release`", file=sys.stderr)
            return 1
        print("\nrewrote the files above")
    else:
        print("kvlib/ and notebooks/ match solutions/")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="kvlib", description="The course on how LLMs generate text.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("check", help="check your exercises (one id like 1.2, a notebook like 01, or all)")
    p.add_argument("selector", nargs="?", help="an exercise id (1.2) or a notebook number (01)")
    p.add_argument("--json", action="store_true", help="print a JSON list of {id, title, notebook, status, message}")
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("course", help="maintainers: build the learner release from solutions/")
    course_sub = p.add_subparsers(dest="course_command", required=True)
    r = course_sub.add_parser("release", help="regenerate kvlib/ stubs and notebooks/ from solutions/")
    r.add_argument("--check", action="store_true", help="write nothing; exit 1 if anything differs")
    r.set_defaults(func=cmd_course_release)

    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
