"""The `kvlib` command: check your progress, run the course, measure it, and (for instructors) grade it.

kvlib check [SELECTOR] [--json]     one row per exercise: id, title, notebook, status, message
kvlib hint ID [--level N]           the next hint of one exercise, only when asked (--reset starts again)
kvlib generate PROMPT               stream the tiny model's answer, then its TTFT and TPOT
kvlib bench NAME [--json]           cache, memory, gqa, serve, compress, fused, spec, class: measured here
kvlib lab [SELECTOR]                open JupyterLab on the course (learner view: nbgrader's Validate button)
kvlib present [SELECTOR] [--check]  the solved notebooks in reference mode; --check runs them and times each
kvlib course release [--check]      regenerate kvlib/ stubs and notebooks/ from solutions/ (and translations/)
kvlib course translate [--check]    the translated notebooks regenerated; what is translated, stale or missing
kvlib course site                   the course as a static site: reference notebooks executed, glossary, guides
kvlib course plan                   each notebook's core and going-further minutes, each exercise's (--record)
kvlib course init DIR               an nbgrader course folder for instructors (docs/instructors.md)
kvlib course autograde A            grade a class in parallel, resumable (--jobs N, --student GLOB, --force)
kvlib course export-canvas          the gradebook as a CSV for Canvas's gradebook import
kvlib course move-gradebook URL     copy the course's gradebook into an empty database (PostgreSQL) and use it
kvlib course claims [SELECTOR ...]  run the reference notebooks, then every claim: holds / does not hold / not decided
A SELECTOR is one grammar everywhere (kvlib.course.exercises): 1.2, 01, 02b or a notebook's path. Every
subcommand has its own --help; a bad argument is a one-line message and exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import shutil
import statistics
import sys
import textwrap
import time
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from kvlib import checks
from kvlib.core import progress
from kvlib.core.paths import ROOT
from kvlib.course import hints, i18n
from kvlib.course.exercises import BY_ID, SELECTORS, ExerciseNotDone, solutions_enabled, solutions_used


def _table(results) -> str:
    """The rows of `kvlib check`: titles whole; the message beside them where the terminal has room, else below.
    In the learner's language (KVLIB_LANG): headings, statuses and titles translated, columns counted as a terminal
    shows them (a Chinese character two wide)."""
    tr, pad, cols = i18n.tr, i18n.ljust, i18n.display_width
    width = shutil.get_terminal_size((100, 20)).columns
    titles = {r.id: hints.exercise_title(BY_ID[r.id]) if r.id in BY_ID else r.title for r in results}
    status = {"pass": tr("pass"), "fail": tr("fail"), "todo": tr("todo")}
    heads = [tr("id"), tr("status"), tr("notebook"), tr("title"), tr("message")]
    w = [max(5, cols(heads[0])), max(6, cols(heads[1]), *map(cols, status.values())), max(14, cols(heads[2]))]
    title = max([5, cols(heads[3]), *(cols(t) for t in titles.values())])
    left = w[0] + 1 + w[1] + 1 + w[2] + 1 + title + 1
    beside = width - left >= 40  # room for a readable message column
    indent = " " * (left if beside else 6)
    head = f"{pad(heads[0], w[0])} {pad(heads[1], w[1])} {pad(heads[2], w[2])} {pad(heads[3], title)} {heads[4]}"
    lines = [head, "-" * min(width, cols(head) + 40)]
    for r in results:
        msg = i18n.wrap(r.message, max(30, width - len(indent))) or [""]
        row = f"{pad(r.id, w[0])} {pad(status.get(r.status, r.status), w[1])} {pad(r.notebook, w[2])} "
        row += pad(titles[r.id], title)
        if beside:
            lines.append(f"{row} {msg[0]}".rstrip())
            lines += [indent + m for m in msg[1:]]
        else:
            lines.append(row.rstrip())
            lines += [indent + m for m in msg if m]
    done = sum(r.status == "pass" for r in results)
    lines.append(
        "\n"
        + tr("{done} of {total} exercises pass", done=done, total=len(results))
        + (tr(" (reference mode: KVLIB_SOLUTIONS is on)") if _reference_mode() else "")
    )
    return "\n".join(lines)


def _reference_mode() -> bool:
    return solutions_enabled()


def cmd_check(args) -> int:
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


def cmd_hint(args) -> int:
    """The next hint of one exercise (kvlib.course.hints: the levels seen are remembered per exercise)."""
    try:
        if args.reset:
            hints.reset(args.exercise)
            print(f"hints of {args.exercise} start again at 1 (kept in {hints.state_file()})")
            if args.level is None:
                return 0
        print(hints.show(args.exercise, args.level))
    except ValueError as err:  # an unknown id, a level out of range, a malformed hint file
        print(f"kvlib hint: {err}", file=sys.stderr)
        return 2
    return 0


class _Stop(Exception):
    """Raised from the streaming callback to end generation at the stop text."""


def cmd_generate(args) -> int:
    import torch  # noqa: PLC0415 (start-up time: torch only for the commands that run a model)

    from kvlib.core.weights import load_tiny  # noqa: PLC0415 (start-up time: torch only for the commands that run a model)
    from kvlib.generation import generate  # noqa: PLC0415 (late binding: runs the learner's code)
    from kvlib.measure.timing import environment, num_threads  # noqa: PLC0415 (start-up time: torch only for the commands that run a model)

    args.prompt = args.prompt.replace("\\n", "\n")  # a typed \n is a newline, as in the course's prompts
    if not args.prompt:
        print(
            "kvlib generate: the prompt is empty: give the model something to continue, e.g. kvlib generate '法国的首都是'",
            file=sys.stderr,
        )
        return 2
    try:
        model, tokenizer = load_tiny()
        ids = torch.tensor([tokenizer.encode(args.prompt)])
    except (ValueError, FileNotFoundError) as err:
        print(f"kvlib generate: {err}", file=sys.stderr)
        return 2
    times, text = [], []

    def on_token(token):
        times.append(time.perf_counter())
        piece = tokenizer.decode(token.tolist())
        text.append(piece)
        if args.stop and args.stop in "".join(text):
            raise _Stop
        print(piece, end="", flush=True)

    print(args.prompt, end="", flush=True)
    generator = torch.Generator().manual_seed(args.seed)
    with num_threads(args.threads), solutions_used() if args.reference else contextlib.nullcontext():
        env = environment("cpu")  # the setting the tokens are generated under
        start = time.perf_counter()
        try:
            generate(
                model, ids, args.max_new_tokens, temperature=args.temperature, generator=generator, on_token=on_token
            )
        except _Stop:
            pass
        except ExerciseNotDone as err:
            print(
                f"\nkvlib generate runs your generation loop: {err} (--reference runs the reference)", file=sys.stderr
            )
            return 1
        except ValueError as err:
            print(f"\nkvlib generate: {err}", file=sys.stderr)
            return 2
    print()
    if times:
        gaps = [b - a for a, b in zip(times, times[1:])]
        tpot = f"{statistics.median(gaps) * 1e3:.2f} ms median over {len(gaps)} steps" if gaps else "n/a (one token)"
        print(
            f"TTFT {(times[0] - start) * 1e3:.2f} ms (prompt of {ids.shape[1]} tokens) | TPOT {tpot} | "
            f"naive decoding, {env['threads']} thread(s), {env['device']}",
            file=sys.stderr,
        )
    return 0


@dataclass(frozen=True)
class Bench:
    """One `kvlib bench NAME`: its module kvlib.measure.bench_<name> has bench_<name>(threads=, quick=, ...), which
    returns a JSON-ready record, and format_<name>(record)."""

    help: str  # one line, in `kvlib bench --help`'s list
    description: str  # `kvlib bench NAME --help`
    device: bool = False  # takes --device cpu|cuda


BENCHES = {
    "cache": Bench(
        "tokens/s with and without a KV cache, against transformers and llama.cpp (notebook 04)",
        "Tokens per second without a cache, with kvlib's KVCache (eager and compiled), with transformers' "
        "DynamicCache and StaticCache and with llama.cpp (F32, Q8_0; with the peers extra), on the tiny model and a "
        "GPT-2-size one, paired and interleaved. CPU only.",
    ),
    "memory": Bench(
        "bandwidth, matmul FLOP/s, a decode step predicted then timed (notebook 05)",
        "The bandwidth ceiling (the highest of five kernels), matmul FLOP/s and a memory-bound decode step "
        "predicted from bytes / bandwidth and measured, eager and compiled: on the CPU, then on a GPU if present.",
        device=True,
    ),
    "gqa": Bench(
        "decode time at long context against n_kv_heads (notebook 06)",
        "One decode step at long context against n_kv_heads (MHA, GQA, MQA), attention done three ways "
        "(repeated heads, grouped, SDPA) and split-K, with each step's fixed part and the roofline's prediction.",
        device=True,
    ),
    "serve": Bench(
        "many requests: static vs continuous batching, paged KV, shared prefixes (notebook 07)",
        "64 requests at equal KV memory, served by static, iteration-level and continuous batching: throughput, "
        "TTFT and inter-token latency p50/p99, KV in use, preemption, shared prefixes; decode steps against batch.",
    ),
    "compress": Bench(
        "smaller caches: bytes, int8 and window quality, int8 vs float32, MLA (notebook 08)",
        "Bytes per token of every cache scheme with published configs, int8 and rolling-window quality on the tiny "
        "model, int8 against float32 decode (predicted, measured) and MLA's two paths counted. CPU only.",
    ),
    "fused": Bench(
        "attention's peak memory naive vs tiled, causal FLOPs, int8 decode (notebook 09)",
        "Peak memory of causal attention naive, tiled and fused, the FLOPs causal tiles skip, and a decode step's "
        "attention float32 against int8 copied, folded and compiled, beside the bandwidth ceiling. CPU only.",
    ),
    "spec": Bench(
        "speculative decoding against gamma: acceptance, speedup (notebook 10)",
        "Speculative decoding with a drafter model and with prompt lookup, against gamma: alpha, tokens per pass "
        "beside the formula, the cost ratio c, predicted and measured speedup; a forward's time against tokens fed.",
    ),
}


def cmd_bench_class(args) -> int:
    from kvlib.app.class_bench import bench_class, format_class  # noqa: PLC0415 (not in learners' folders: instructor only)

    try:
        report = bench_class(
            students=args.students, assignment=args.assignment, jobs=args.jobs, db=args.db, via=args.via
        )
    except (FileNotFoundError, ValueError) as err:
        print(f"kvlib bench class: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:  # a score that is not the expected one, or a step that failed
        print(f"kvlib bench class: {err}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=1) if args.json else format_class(report))
    return 0


def cmd_bench(args) -> int:
    bench = importlib.import_module(f"kvlib.measure.bench_{args.which}")
    on = {}
    if getattr(args, "device", None):
        on = {"devices": [args.device]} if args.which == "memory" else {"device": args.device}
    if getattr(args, "ways", None):
        on = {"ways": [w.strip() for w in args.ways.split(",") if w.strip()]}
    try:
        with solutions_used() if args.reference else contextlib.nullcontext():
            report = getattr(bench, f"bench_{args.which}")(threads=args.threads, quick=args.quick, **on)
    except (FileNotFoundError, ValueError) as err:
        print(f"kvlib bench {args.which}: {err}", file=sys.stderr)
        return 2
    except NotImplementedError as err:  # ExerciseNotDone (a RuntimeError too, so first): it runs the learner's kvlib
        print(
            f"kvlib bench {args.which}: {err}\n(benchmarks run your own kvlib; --reference, or KVLIB_SOLUTIONS=1, runs the reference)",
            file=sys.stderr,
        )
        return 2
    except RuntimeError as err:  # e.g. two ways of generating disagreed on the greedy tokens: no table to trust
        print(f"kvlib bench {args.which}: {err}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=1) if args.json else getattr(bench, f"format_{args.which}")(report))
    if args.which == "cache" and (crashed := bench.crashed_asked(report)):  # a way asked for by name did not run
        print(f"kvlib bench cache: {', '.join(crashed)} crashed (the table says how)", file=sys.stderr)
        return 1
    return 0


def cmd_course_release(args) -> int:
    from kvlib.app import sitting, translate  # noqa: PLC0415 (not in learners' folders: instructor only)

    try:  # the header lines first: notebooks/ is made from solutions/ with them
        problems = sitting.sync_headers(check=args.check) + translate.release(check=args.check)
    except ValueError as err:  # a hint file out of form, or printed lines not recorded for a changed cell
        print(f"kvlib course release: {err}", file=sys.stderr)
        return 2
    if problems:
        print("\n".join(problems))
        if args.check:
            print("\nthe learner release is out of date: run `kvlib course release`", file=sys.stderr)
            return 1
        print("\nrewrote the files above")
    else:
        print("kvlib/ and notebooks/ match solutions/")
    return 0


def cmd_course_translate(args) -> int:
    from kvlib.app import translate  # noqa: PLC0415 (not in learners' folders: instructor only)

    try:
        built = translate.release(check=True) if args.check else translate.release()
        lines, ok = translate.report(args.lang, missing=args.missing)
    except ValueError as err:  # a translation or hint file out of form, a glossary row that does not pair
        print(f"kvlib course translate: {err}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    generated = [p for p in built if f"/{args.lang}/" in p]
    if generated:
        print("\n" + "\n".join(generated))
        print(
            "the translated notebooks are out of date: run `kvlib course translate`" if args.check else "rewrote them"
        )
    return 0 if ok and not (args.check and generated) else 1


def cmd_course_site(args) -> int:
    from kvlib.app import site  # noqa: PLC0415 (start-up time: only this command builds the site)

    if missing := site.missing_tools():
        print(f"kvlib course site: {', '.join(missing)} missing: pip install -e '.[site]'", file=sys.stderr)
        return 2
    start = time.perf_counter()
    try:
        index = site.build(args.out, executed=args.executed, timeout=args.timeout)
    except RuntimeError as err:
        print(f"kvlib course site: {err}", file=sys.stderr)
        return 1
    print(f"built the site in {time.perf_counter() - start:.0f} s: open {index}")
    return 0


def cmd_course_plan(args) -> int:
    from kvlib.app import sitting  # noqa: PLC0415 (not in learners' folders: instructor only)

    try:
        if args.record:
            sitting.record_outputs(None if args.record == "all" else args.record)
        if args.calibration:
            print(sitting.calibration_table())
            return 0
        sittings = sitting.course()
    except (ValueError, FileNotFoundError) as err:  # a stale record, an unknown notebook, no git history
        print(f"kvlib course plan: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:  # a notebook failed while recording
        print(f"kvlib course plan: {err}", file=sys.stderr)
        return 1
    print(sitting.plan_table(sittings) + "\n\nWhat fits a workshop, from 01:\n" + sitting.workshop_plan(sittings))
    return 0


def cmd_course_init(args) -> int:
    from pathlib import Path  # noqa: PLC0415 (start-up time: only this command needs it)

    from kvlib.app.course_folder import (  # noqa: PLC0415 (not in learners' folders: instructor only)
        STUDENT_CONFIG,
        CourseFolderExists,
        exchange_problems,
        init_course,
        permission_problems,
    )

    if args.check:
        folder = Path(args.dir)
        if not (folder / "nbgrader_config.py").is_file():
            print(
                f"kvlib course init --check: {folder} is not a course folder (no nbgrader_config.py)", file=sys.stderr
            )
            return 2
        problems = permission_problems(folder)
        if args.exchange:
            problems += exchange_problems(Path(args.exchange), args.course_id, folder.stat().st_uid)
        for problem in problems:
            print(f"warning: {problem}")
        print(f"{folder}: {len(problems)} problem(s)" if problems else f"{folder} is its owner's alone")
        return 1 if problems else 0
    try:
        written = init_course(
            args.dir,
            earlier=args.earlier,
            force=args.force,
            course_id=args.course_id,
            exchange=args.exchange,
            service=args.exchange_service,
            lang=args.lang,
        )
    except CourseFolderExists as err:
        print(f"kvlib course init: {err}", file=sys.stderr)
        return 1
    except (ValueError, PermissionError) as err:
        print(f"kvlib course init: {err}", file=sys.stderr)
        return 2
    print(f"wrote {len(written)} files under {args.dir}" if written else f"{args.dir} is already up to date")
    if args.exchange or args.exchange_service:
        where = f"{args.exchange}/{args.course_id}" if args.exchange else f"{args.exchange_service} ({args.course_id})"
        print(
            f"exchange: {where}; students need {Path(args.dir) / STUDENT_CONFIG} as "
            "/etc/jupyter/nbgrader_config.py on the hub, or as each one's ~/.jupyter/nbgrader_config.py"
        )
    print(f"next: cd {args.dir} && nbgrader generate_assignment 01-attention (docs/instructors.md)")
    return 0


def cmd_course_autograde(args) -> int:
    from kvlib.app.class_grading import CourseError, autograde  # noqa: PLC0415 (not in learners' folders: instructor only)

    try:
        results = autograde(
            args.course,
            args.assignment,
            jobs=args.jobs,
            student=args.student,
            force=args.force,
            budget=args.budget,
            progress=not args.quiet,
        )
    except CourseError as err:
        print(f"kvlib course autograde: {err}", file=sys.stderr)
        return 2
    return 1 if any(r.status == "failed" for r in results.values()) else 0


def cmd_course_move_gradebook(args) -> int:
    from kvlib.app.class_grading import CourseError, move_course_gradebook  # noqa: PLC0415 (not in learners' folders: instructor only)

    try:
        move_course_gradebook(args.course, args.url)
    except CourseError as err:
        print(f"kvlib course move-gradebook: {err}", file=sys.stderr)
        return 2
    return 0


def cmd_course_export_canvas(args) -> int:
    from kvlib.app.class_grading import CourseError, canvas_csv  # noqa: PLC0415 (not in learners' folders: instructor only)

    try:
        text = canvas_csv(args.course, args.assignment or None, roster=args.roster)
    except (CourseError, OSError) as err:
        print(f"kvlib course export-canvas: {err}", file=sys.stderr)
        return 2
    if args.to == "-":
        sys.stdout.write(text)
    else:
        with open(args.to, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {args.to}: {text.count(chr(10)) - 2} students", file=sys.stderr)
    return 0


def cmd_course_claims(args) -> int:
    from kvlib.app import lab, release  # noqa: PLC0415 (not in learners' folders: lab needs app/release.py)
    from kvlib.course import claims  # noqa: PLC0415 (start-up time: only this command reads the claims)

    try:
        paths = [p for s in args.notebooks or [None] for p in lab.solution_notebooks(s)]
    except ValueError as err:
        print(f"kvlib course claims: {err}", file=sys.stderr)
        return 2
    parts = sorted({release.part(p) for p in paths})
    failed = []
    if not args.last:  # run them now: this machine's verdicts, this sitting's
        for part in parts:
            (claims.record_dir() / f"{part}.json").unlink(missing_ok=True)
        for selector in args.notebooks or [None]:  # a bar over their cells, a line per notebook (stderr: the
            runs = lab.check_course(selector, timeout=args.timeout, out=sys.stderr)  # report is stdout's)
            failed += [run.path for run in runs if run.error]
    records = claims.load(notebooks=parts if args.notebooks else None)
    print(json.dumps(records, indent=1, ensure_ascii=False) if args.json else claims.report(records))
    return 1 if failed else 0


def cmd_lab(args) -> int:
    from kvlib.app import lab  # noqa: PLC0415 (not in learners' folders: lab needs app/release.py)

    try:
        return lab.launch(
            reference=args.command == "present",
            target=args.notebook,
            port=args.port,
            browser=not args.no_browser,
            lang=args.lang or i18n.language(),
        )
    except ValueError as err:
        print(f"kvlib {args.command}: {err}", file=sys.stderr)
        return 2


def cmd_present(args) -> int:
    if not args.check:
        given = (
            ("--figures", args.figures is not None),
            ("--timeout", args.timeout is not None),
            ("--quiet", args.quiet),
        )
        misplaced = [option for option, there in given if there]
        if misplaced:
            print(f"kvlib present: {misplaced[0]} belongs to a --check run; add --check", file=sys.stderr)
            return 2
        return cmd_lab(args)
    if args.lang:
        print("kvlib present: --check runs the English notebooks, whose code the translated ones share; drop --lang",
              file=sys.stderr)  # fmt: skip
        return 2
    from kvlib.app import lab  # noqa: PLC0415 (not in learners' folders: lab needs app/release.py)

    start = time.perf_counter()
    try:
        runs = lab.check_course(args.notebook, timeout=args.timeout or 120, figures=args.figures)
    except ValueError as err:
        print(f"kvlib present: {err}", file=sys.stderr)
        return 2
    failed = [r for r in runs if r.error]
    print(
        f"{len(runs)} notebooks in {time.perf_counter() - start:.1f} s, reference mode, "
        f"{len(runs) - len(failed)} ran top to bottom" + (f", {len(failed)} failed" if failed else "")
    )
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------
# The parser: a subcommand per command, each with its own description and only its own options


QUIET_HELP = "no progress bar (one shows only on a terminal)"
REFERENCE_HELP = "run the reference solutions, not your kvlib"


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad argument a one-line message (not the usage block) and exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _whole(low: int, high: int | None = None):
    """An argparse type: a whole number from low (to high)."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = None
        if n is None or n < low or (high is not None and n > high):
            bound = f"from {low} to {high}" if high is not None else f"of at least {low}"
            raise argparse.ArgumentTypeError(f"expected a whole number {bound}, got {text!r}")
        return n

    return parse


def _not_negative(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not math.isfinite(x) or x < 0:
        raise argparse.ArgumentTypeError(f"expected a number of at least 0, got {text!r}")
    return x


def _folder(text: str) -> Path:
    """An argparse type: a folder to write into, there or not yet (never an existing file)."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a folder")
    return path


def _version() -> str:
    try:
        number = version("kvlib")
    except PackageNotFoundError:  # run from a folder on PYTHONPATH, not installed
        number = "(not installed)"
    return f"kvlib {number}, course folder {ROOT}"


def _show_help(args) -> int:
    args.parser.print_help()
    return 0


def _command(sub, name: str, help: str, description: str | None = None, **kwargs) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help, description=description or help, **kwargs)
    p.set_defaults(parser=p, func=_show_help)
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="kvlib",
        description="The course on how LLMs generate text: check your exercises, open the notebooks, measure.",
        epilog=f"A SELECTOR is {SELECTORS}. `kvlib COMMAND --help` describes each command.",
    )
    parser.add_argument("--version", action="version", version=_version())
    parser.set_defaults(parser=parser, func=_show_help)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")

    p = _command(
        sub,
        "check",
        "check your exercises: all, one, a notebook's or a part's",
        "Run every check of your exercises and print one row each: id, title, notebook, status (pass, fail with "
        "the mistake named, todo) and the first failure's message. Exit 0 when all pass, 1 otherwise.",
    )
    p.add_argument("selector", nargs="?", metavar="SELECTOR", help=f"{SELECTORS}; default: every exercise")
    p.add_argument("--json", action="store_true", help="print a JSON list of {id, title, notebook, status, message}")
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_check)

    p = _command(
        sub,
        "hint",
        "the next hint of one exercise: a nudge first, then the idea, then the last step",
        "Show the next hint of one exercise, only when asked: level 1 is a nudge, 2 the idea, 3 the last step "
        f"short of code. The levels seen are kept per course folder in {hints.state_file()}.",
    )
    p.add_argument("exercise", help="an exercise id, e.g. 1.2")
    p.add_argument("--level", type=_whole(1), help="show hint N (1 is the nudge) instead of the next one")
    p.add_argument("--reset", action="store_true", help="forget the hints seen of this exercise: the next is 1 again")
    p.set_defaults(func=cmd_hint)

    p = _command(
        sub,
        "generate",
        "stream the tiny model's continuation of PROMPT, then TTFT and TPOT",
        "Stream the tiny model's continuation of PROMPT through your generation loop (Exercise 2.2), then its time "
        "to first token and time per output token.",
    )
    p.add_argument("prompt", help='e.g. "法国的首都是" or "Q: What is the capital of France?\\nA:"')
    p.add_argument("--max-new-tokens", type=_whole(1), default=40, help="at most this many new tokens (default 40)")
    p.add_argument("--temperature", type=_not_negative, default=0.0, help="0 is greedy (default); above 0 samples")
    p.add_argument("--seed", type=int, default=0, help="seed for sampling")
    p.add_argument(
        "--stop", default="\n", help="stop when the answer contains this text (default: a newline; '' never stops)"
    )
    p.add_argument("--threads", type=_whole(1), default=1, help="torch threads (default 1)")
    p.add_argument("--reference", action="store_true", help=REFERENCE_HELP)
    p.set_defaults(func=cmd_generate)

    p = _command(
        sub,
        "bench",
        "benchmarks measured on this machine: kvlib bench NAME",
        "Benchmarks for the course, each measured on the machine it runs on. Every benchmark runs your kvlib; "
        "--reference runs the reference solutions. `kvlib bench NAME --help` gives its options.",
    )
    benches = p.add_subparsers(dest="which", metavar="NAME", title="benchmarks")
    common = _Parser(add_help=False)
    common.add_argument("--json", action="store_true", help="print the machine-readable record")
    common.add_argument(
        "--threads", type=_whole(1), default=1, help="torch threads (default 1: timings on a shared CPU are steadier)"
    )
    common.add_argument(
        "--quick", action="store_true", help="small stand-in models and few repeats (seconds, for tests)"
    )
    common.add_argument("--reference", action="store_true", help=REFERENCE_HELP)
    common.add_argument("--quiet", action="store_true", help=QUIET_HELP)
    for name, bench in BENCHES.items():
        b = _command(benches, name, bench.help, bench.description, parents=[common])
        if bench.device:
            b.add_argument(
                "--device",
                choices=["cpu", "cuda"],
                default=None,
                help="where to measure (default: "
                + ("the CPU, then a GPU if present)" if name == "memory" else "the CPU)"),
            )
        if name == "cache":
            b.add_argument(
                "--ways",
                metavar="WAY,...",
                help="run only these ways beside kvlib's (no_cache, kvlib_rows, kvlib_compiled, hf_dynamic, hf_static, "
                "llama_f32, llama_q8_0); exit 1 if one of them crashes (by default a crash is a row and the rest is "
                "measured)",
            )
        b.set_defaults(func=cmd_bench)
    b = _command(
        benches,
        "class",
        "a synthetic class graded by `kvlib course autograde`, every score checked (instructors)",
        "Grade a synthetic class of submissions with `kvlib course autograde` in a throwaway course folder, check "
        "every score against the one expected, and time the grading.",
    )
    b.add_argument("--json", action="store_true", help="print the machine-readable record")
    b.add_argument("--students", type=_whole(1), default=20, help="how many students (default 20)")
    b.add_argument("--assignment", default="01-attention", help="the notebook graded (default 01-attention)")
    b.add_argument("--jobs", type=_whole(1), default=1, help="parallel grading workers (default 1)")
    b.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite", help="the gradebook (default sqlite)")
    b.add_argument(
        "--via",
        choices=["exchange", "submitted"],
        default="exchange",
        help="hand the class in through nbgrader's exchange (submit, collect; default) or straight into "
        "submitted/ (as zip_collect leaves it)",
    )
    b.set_defaults(func=cmd_bench_class)

    for name, text, description in (
        (
            "lab",
            "open JupyterLab on the course: the learner notebooks, your kvlib",
            "Open JupyterLab on the course in the learner view (nbgrader's Validate button, none of the instructor's "
            "menus), on notebooks/ or the notebook a SELECTOR names. Your ~/.jupyter settings apply.",
        ),
        (
            "present",
            "presenters: the solved notebooks in reference mode; --check runs them all",
            "Open JupyterLab on the solved notebooks (solutions/) in reference mode (KVLIB_SOLUTIONS=1), or with "
            "--check run them headless, top to bottom, printing the seconds each took (exit 1 naming a failure).",
        ),
    ):
        p = _command(sub, name, text, description)
        p.add_argument("notebook", nargs="?", metavar="SELECTOR", help=f"{SELECTORS}; default: the folder")
        p.add_argument(
            "--port",
            type=_whole(1, 65535),
            help="the port to serve on (default: Jupyter's, 8888 or the next free one)",
        )
        p.add_argument("--no-browser", action="store_true", help="print the URL instead of opening a browser")
        p.add_argument(
            "--lang",
            choices=i18n.LANGUAGES,
            help=f"the course's language: its notebooks, hints, messages, figures and JupyterLab's menus (default: "
            f"${i18n.ENV}, else en)",
        )
        if name == "present":
            p.add_argument(
                "--check",
                action="store_true",
                help="open nothing: run the solution notebooks headless, top to bottom, and print the seconds each took",
            )
            p.add_argument(
                "--timeout",
                type=_whole(1),
                help="with --check: seconds one cell may take (default 120, as nbgrader_config.py)",
            )
            p.add_argument(
                "--figures",
                metavar="DIR",
                type=_folder,
                help="with --check: save every figure the notebooks show as a PNG in DIR",
            )
            p.add_argument("--quiet", action="store_true", help="with --check: " + QUIET_HELP)
        p.set_defaults(func=cmd_present if name == "present" else cmd_lab)

    p = _command(
        sub,
        "course",
        "maintainers and instructors: the learner release, a course folder, grading",
        "Build the learner release from solutions/ (maintainers), make an nbgrader course folder, grade a class "
        "and export its grades (instructors; docs/instructors.md).",
    )
    course_sub = p.add_subparsers(dest="course_command", metavar="COMMAND", title="commands")
    r = _command(course_sub, "release", "regenerate kvlib/ stubs and notebooks/ from solutions/")
    r.add_argument("--check", action="store_true", help="write nothing; exit 1 if anything differs")
    r.set_defaults(func=cmd_course_release)
    s = _command(
        course_sub,
        "site",
        "the course as a static site: the reference notebooks executed, the glossary and the guides",
        "Build the course as a static HTML site (Sphinx with MyST-NB): the README as its front page, every reference "
        "notebook executed in reference mode with its figures and outputs, the glossary and the guides. Fails on a "
        "broken link or a notebook page without its figures. Needs the site extra: pip install -e '.[site]'.",
    )
    s.add_argument("--out", type=_folder, default=ROOT / "build" / "site", help="where (default build/site)")
    s.add_argument(
        "--executed",
        metavar="DIR",
        type=_folder,
        help="executed notebooks laid out as solutions/ to reuse (the tests leave them in $KVLIB_EXECUTED_DIR); the "
        "others are run",
    )
    s.add_argument("--timeout", type=_whole(1), default=120, help="seconds one cell may take (default 120)")
    s.add_argument("--quiet", action="store_true", help=QUIET_HELP)
    s.set_defaults(func=cmd_course_site)
    pl = _command(
        course_sub,
        "plan",
        "each notebook's core and going-further minutes and each exercise's, by the sitting estimate",
    )
    pl.add_argument(
        "--record",
        nargs="?",
        const="all",
        metavar="NN",
        help="first run the solution notebooks (all, or notebook NN) and record the lines their cells print",
    )
    pl.add_argument("--calibration", action="store_true", help="the estimate beside the careful readers' minutes")
    pl.set_defaults(func=cmd_course_plan)
    i = _command(course_sub, "init", "instructors: write an nbgrader course folder with isolated grading")
    i.add_argument("dir", type=_folder, help="the course folder to create or update")
    i.add_argument(
        "--earlier",
        choices=["own", "given"],
        default="own",
        help="earlier notebooks' kvlib modules: the learners' own (stubs to fill in) or given (the reference)",
    )
    i.add_argument("--force", action="store_true", help="replace files that differ (each is kept as <name>.bak first)")
    i.add_argument(
        "--course-id", default="kvlib", help="nbgrader's CourseDirectory.course_id (your own on a shared exchange)"
    )
    i.add_argument(
        "--exchange",
        metavar="ROOT",
        type=_folder,
        help="set up nbgrader's exchange for the course there (e.g. /srv/nbgrader/exchange) and write the students' config",
    )
    i.add_argument(
        "--exchange-service",
        metavar="URL",
        help="exchange through the hub's kvlib-exchange service instead (students' servers and graders on other "
        "machines; e.g. https://hub.example.edu/services/kvlib-exchange/) and write the students' config",
    )
    i.add_argument(
        "--check",
        action="store_true",
        help="write nothing: say what lets anyone but the folder's owner in (exit 1 if any)",
    )
    i.add_argument(
        "--lang",
        choices=i18n.LANGUAGES,
        default=i18n.DEFAULT,
        help="the notebooks' language: each translated one in it, the others in English (default en)",
    )
    i.set_defaults(func=cmd_course_init)
    a = _command(
        course_sub, "autograde", "instructors: grade every collected submission in parallel workers, resumable"
    )
    a.add_argument("assignment", help="the assignment, e.g. 04-kv-cache")
    a.add_argument(
        "--jobs", type=_whole(1), default=1, help="parallel workers, one nbgrader start-up each (about one a core)"
    )
    a.add_argument("--student", default="*", help="a glob of student ids (default: everyone who submitted)")
    a.add_argument("--force", action="store_true", help="regrade those already graded at their current submission")
    a.add_argument("--course", default=".", help="the course folder (default: the current one)")
    a.add_argument(
        "--budget", type=float, metavar="SECONDS", help="stop grading a submission after this long (it fails)"
    )
    a.add_argument("--quiet", action="store_true", help="no progress bar")
    a.set_defaults(func=cmd_course_autograde)
    t = _command(
        course_sub,
        "translate",
        "maintainers: regenerate the translated notebooks and list what is translated, stale or missing",
        "Regenerate solutions/LANG/ and notebooks/LANG/ from the English notebooks and translations/LANG/ (as `kvlib "
        "course release` does), then list each notebook's translation (complete, stale naming the cells, missing), "
        "its cells held to the glossary's terms, numbers and code, and the hints and messages translated. Exit 1 "
        "when anything translated is stale.",
    )
    t.add_argument("--lang", choices=[lang for lang in i18n.LANGUAGES if lang != i18n.DEFAULT], default="zh-CN")
    t.add_argument("--check", action="store_true", help="write nothing; exit 1 also if the built notebooks differ")
    t.add_argument(
        "--missing", action="store_true", help="list every place of the code whose messages are not translated"
    )
    t.set_defaults(func=cmd_course_translate)
    m = _command(
        course_sub, "move-gradebook", "instructors: copy the course's gradebook into an empty database and use it there"
    )
    m.add_argument("url", help="the new gradebook, e.g. postgresql+psycopg2://kvlib:PASSWORD@127.0.0.1/gradebook")
    m.add_argument("--course", default=".", help="the course folder (default: the current one)")
    m.set_defaults(func=cmd_course_move_gradebook)
    c = _command(
        course_sub,
        "claims",
        "presenters: run the reference notebooks here and print every claim: holds, does not hold, not decided",
    )
    c.add_argument("notebooks", nargs="*", metavar="SELECTOR", help=f"{SELECTORS}; default: every notebook")
    c.add_argument("--last", action="store_true", help="run nothing: report the last run's record on this machine")
    c.add_argument("--json", action="store_true", help="print the records as JSON")
    c.add_argument("--timeout", type=_whole(1), default=120, help="seconds one cell may take (default 120)")
    c.set_defaults(func=cmd_course_claims)
    e = _command(course_sub, "export-canvas", "instructors: the gradebook as a CSV for Canvas's gradebook import")
    e.add_argument("--course", default=".", help="the course folder (default: the current one)")
    e.add_argument("--assignment", action="append", help="only these assignments (repeat; default: all)")
    e.add_argument("--roster", help="a CSV exported from the Canvas gradebook: names, ids and sections to fill in")
    e.add_argument("--to", default="canvas_grades.csv", help="the file to write (- for standard output)")
    e.set_defaults(func=cmd_course_export_canvas)
    return parser


def main(argv=None) -> int:
    args, extra = build_parser().parse_known_args(argv)
    if extra:  # named by the subcommand they were given to, not by `kvlib`
        args.parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        i18n.language()
    except ValueError as err:  # KVLIB_LANG set to a language the course does not have
        print(f"{args.parser.prog}: {err}", file=sys.stderr)
        return 2
    try:
        with progress.quiet(getattr(args, "quiet", False)):
            return args.func(args)
    except KeyboardInterrupt:
        print(f"\n{args.parser.prog}: stopped", file=sys.stderr)
        return 130
    except OSError as err:  # a path that cannot be read or written: name it, with no traceback
        print(f"{args.parser.prog}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
