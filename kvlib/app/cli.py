"""The `kvlib` command: check your progress, and (for maintainers) rebuild the learner release.

kvlib check [ID|NN] [--json]   one row per exercise: id, title, notebook, status, message
kvlib hint ID [--level N]      the next hint of one exercise, only when asked (--reset starts again)
kvlib generate PROMPT          stream the tiny model's answer, then its TTFT and TPOT
kvlib bench NAME [--json]      cache, memory, gqa, serve, compress, fused, spec: measured here (kvlib bench -h)
kvlib lab [NN]                 open JupyterLab on the course (learner view: nbgrader's Validate button)
kvlib present [NN] [--check]   the solved notebooks in reference mode; --check runs them all and times each
kvlib course release [--check] regenerate kvlib/ stubs and notebooks/ from solutions/
kvlib course plan              each notebook's core and going-further minutes, each exercise's (--record)
kvlib course init DIR          an nbgrader course folder for instructors (docs/instructors.md)
kvlib course autograde A       grade a class in parallel, resumable (--jobs N, --student GLOB, --force)
kvlib course export-canvas     the gradebook as a CSV for Canvas's gradebook import
kvlib course claims [NN ...]   run the reference notebooks, then every claim: holds / does not hold / not decided
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import statistics
import sys
import textwrap
import time

from kvlib import checks
from kvlib.course import hints
from kvlib.course.exercises import ExerciseNotDone, solutions_enabled


def _table(results) -> str:
    width = shutil.get_terminal_size((100, 20)).columns
    head = f"{'id':<5} {'status':<6} {'notebook':<14} {'title':<27} message"
    lines = [head, "-" * min(width, 110)]
    indent = " " * 56
    for r in results:
        msg = textwrap.wrap(r.message, max(30, width - len(indent))) or [""]
        lines.append(f"{r.id:<5} {r.status:<6} {r.notebook:<14} {r.title[:27]:<27} {msg[0]}")
        lines += [indent + m for m in msg[1:]]
    done = sum(r.status == "pass" for r in results)
    lines.append(
        f"\n{done} of {len(results)} exercises pass"
        + (" (reference mode: KVLIB_SOLUTIONS is on)" if _reference_mode() else "")
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
    try:
        model, tokenizer = load_tiny()
        if not args.prompt:
            raise ValueError(
                "the prompt is empty: give the model something to continue, e.g. kvlib generate '法国的首都是'"
            )
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
    with num_threads(args.threads):
        env = environment("cpu")  # the setting the tokens are generated under
        start = time.perf_counter()
        try:
            generate(
                model, ids, args.max_new_tokens, temperature=args.temperature, generator=generator, on_token=on_token
            )
        except _Stop:
            pass
        except ExerciseNotDone as err:
            print(f"\nkvlib generate runs your generation loop: {err}", file=sys.stderr)
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


# kvlib bench NAME: help, then the module kvlib.measure.bench_<name> with its measuring function and
# formatter; each function takes threads= and quick= and returns a JSON-ready record
BENCHES = {
    "cache": (
        "tokens/s without and with a KV cache, against transformers (DynamicCache, StaticCache) and llama.cpp "
        "(F32, Q8_0; with the peers extra), paired and interleaved",
        "bench_cache",
        "format_cache",
    ),
    "memory": (
        "bandwidth (ceiling: the highest of five kernels), matmul FLOP/s, a memory-bound decode step predicted and "
        "measured",
        "bench_memory",
        "format_memory",
    ),
    "gqa": (
        "decode time at long context against n_kv_heads: MHA, repeated heads, grouped; each step's fixed part",
        "bench_gqa",
        "format_gqa",
    ),
    "serve": (
        "many requests at equal KV memory: static vs continuous batching, paged KV use, shared prefixes",
        "bench_serve",
        "format_serve",
    ),
    "compress": (
        "smaller caches: bytes of every scheme, int8 and window quality on the tiny model, int8 vs float32 decode, MLA's two paths",
        "bench_compress",
        "format_compress",
    ),
    "fused": (
        "fused attention: peak memory naive vs tiled, causal FLOPs, a decode step's attention float32 vs int8 "
        "(copied, folded, compiled)",
        "bench_fused",
        "format_fused",
    ),
    "spec": (
        "speculative decoding: a drafter model, and prompt lookup on a prompt that repeats and on the model's own "
        "document given back, against gamma: alpha, tokens per pass beside the formula, the cost ratio c, predicted "
        "and measured speedup; lookup's choices counted; a forward's time against tokens fed at once",
        "bench_spec",
        "format_spec",
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
    if args.which == "class":
        return cmd_bench_class(args)
    if args.threads < 1:
        print("kvlib bench: --threads must be at least 1", file=sys.stderr)
        return 2
    _, run, fmt = BENCHES[args.which]
    bench = importlib.import_module(f"kvlib.measure.bench_{args.which}")
    on = {}
    if args.device:
        if args.which == "cache":
            print(
                "kvlib bench cache: runs on the CPU only (it times transformers and llama.cpp beside kvlib there)",
                file=sys.stderr,
            )
            return 2
        on = {"devices": [args.device]} if args.which == "memory" else {"device": args.device}
    if args.ways:
        if args.which != "cache":
            print(f"kvlib bench {args.which}: --ways is for kvlib bench cache only", file=sys.stderr)
            return 2
        on = {"ways": [w.strip() for w in args.ways.split(",") if w.strip()]}
    try:
        report = getattr(bench, run)(threads=args.threads, quick=args.quick, **on)
    except (FileNotFoundError, ValueError) as err:
        print(f"kvlib bench: {err}", file=sys.stderr)
        return 2
    except (
        NotImplementedError
    ) as err:  # ExerciseNotDone (a RuntimeError too, so first): a benchmark runs the learner's kvlib
        print(
            f"kvlib bench {args.which}: {err}\n(benchmarks run your own kvlib; KVLIB_SOLUTIONS=1 runs the reference)",
            file=sys.stderr,
        )
        return 2
    except RuntimeError as err:  # e.g. two ways of generating disagreed on the greedy tokens: no table to trust
        print(f"kvlib bench {args.which}: {err}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=1) if args.json else getattr(bench, fmt)(report))
    if args.which == "cache" and (crashed := bench.crashed_asked(report)):  # a way asked for by name did not run
        print(f"kvlib bench cache: {', '.join(crashed)} crashed (the table says how)", file=sys.stderr)
        return 1
    return 0


def cmd_course_release(args) -> int:
    from kvlib.app import release, sitting  # noqa: PLC0415 (not in learners' folders: instructor only)

    try:  # the header lines first: notebooks/ is made from solutions/ with them
        problems = sitting.sync_headers(check=args.check) + release.release(check=args.check)
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
            args.dir, earlier=args.earlier, force=args.force, course_id=args.course_id, exchange=args.exchange
        )
    except CourseFolderExists as err:
        print(f"kvlib course init: {err}", file=sys.stderr)
        return 1
    except (ValueError, PermissionError) as err:
        print(f"kvlib course init: {err}", file=sys.stderr)
        return 2
    print(f"wrote {len(written)} files under {args.dir}" if written else f"{args.dir} is already up to date")
    if args.exchange:
        print(
            f"exchange: {args.exchange}/{args.course_id}; students need {Path(args.dir) / STUDENT_CONFIG} as "
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
            progress=not args.quiet,
        )
    except CourseError as err:
        print(f"kvlib course autograde: {err}", file=sys.stderr)
        return 2
    return 1 if any(r.status == "failed" for r in results.values()) else 0


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
        for path in paths:
            run = lab.run_notebook(path, timeout=args.timeout)
            print(
                f"{release.label(path):<26} {run.seconds:6.1f} s  {'ok' if run.error is None else run.error}",
                file=sys.stderr,
            )
            failed += [path] if run.error else []
    records = claims.load(notebooks=parts if args.notebooks else None)
    print(json.dumps(records, indent=1, ensure_ascii=False) if args.json else claims.report(records))
    return 1 if failed else 0


def cmd_lab(args) -> int:
    from kvlib.app import lab  # noqa: PLC0415 (not in learners' folders: lab needs app/release.py)

    try:
        return lab.launch(
            reference=args.command == "present", target=args.notebook, port=args.port, browser=not args.no_browser
        )
    except ValueError as err:
        print(f"kvlib {args.command}: {err}", file=sys.stderr)
        return 2


def cmd_present(args) -> int:
    if not args.check:
        if args.figures:
            print("kvlib present: --figures saves the figures of a --check run; add --check", file=sys.stderr)
            return 2
        return cmd_lab(args)
    from kvlib.app import lab  # noqa: PLC0415 (not in learners' folders: lab needs app/release.py)

    start = time.perf_counter()
    try:
        runs = lab.check_course(args.notebook, timeout=args.timeout, figures=args.figures)
    except ValueError as err:
        print(f"kvlib present: {err}", file=sys.stderr)
        return 2
    failed = [r for r in runs if r.error]
    print(
        f"{len(runs)} notebooks in {time.perf_counter() - start:.1f} s, reference mode, "
        f"{len(runs) - len(failed)} ran top to bottom" + (f", {len(failed)} failed" if failed else "")
    )
    return 1 if failed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="kvlib", description="The course on how LLMs generate text.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("check", help="check your exercises (one id like 1.2, a notebook like 01, or all)")
    p.add_argument("selector", nargs="?", help="an exercise id (1.2) or a notebook number (01)")
    p.add_argument("--json", action="store_true", help="print a JSON list of {id, title, notebook, status, message}")
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser(
        "hint", help="the next hint of one exercise (1.2): a nudge first, then the idea, then the last step"
    )
    p.add_argument("exercise", help="an exercise id, e.g. 1.2")
    p.add_argument("--level", type=int, help="show hint N (1 is the nudge) instead of the next one")
    p.add_argument("--reset", action="store_true", help="forget the hints seen of this exercise: the next is 1 again")
    p.set_defaults(func=cmd_hint)

    p = sub.add_parser("generate", help="stream the tiny model's continuation of PROMPT, then TTFT and TPOT")
    p.add_argument("prompt", help='e.g. "法国的首都是" or "Q: What is the capital of France?\\nA:"')
    p.add_argument("--max-new-tokens", type=int, default=40, help="at most this many new tokens (default 40)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default); above 0 samples")
    p.add_argument("--seed", type=int, default=0, help="seed for sampling")
    p.add_argument(
        "--stop", default="\n", help="stop when the answer contains this text (default: a newline; '' never stops)"
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("bench", help="benchmarks measured on this machine")
    p.add_argument(
        "which",
        choices=[*BENCHES, "class"],
        help="; ".join(f"{k}: {v[0]}" for k, v in BENCHES.items())
        + "; class: a synthetic class graded by `kvlib course autograde`, every score checked",
    )
    p.add_argument("--json", action="store_true", help="print the machine-readable record")
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads (default 1: timings on a shared CPU are steadier)"
    )
    p.add_argument("--quick", action="store_true", help="small stand-in models and few repeats (seconds, for tests)")
    p.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default=None,
        help="memory, gqa: where to measure (default: memory the CPU then a GPU if present; gqa the CPU)",
    )
    p.add_argument(
        "--ways",
        metavar="WAY,...",
        help="cache: run only these ways beside kvlib's (no_cache, kvlib_rows, kvlib_compiled, hf_dynamic, hf_static, "
        "llama_f32, llama_q8_0); exit 1 if one of them crashes (by default a crash is a row and the rest is measured)",
    )
    p.add_argument("--students", type=int, default=20, help="class: how many students (default 20)")
    p.add_argument("--assignment", default="01-attention", help="class: the notebook graded (default 01-attention)")
    p.add_argument("--jobs", type=int, default=1, help="class: parallel grading workers (default 1)")
    p.add_argument(
        "--db", choices=["sqlite", "postgres"], default="sqlite", help="class: the gradebook (default sqlite)"
    )
    p.add_argument(
        "--via",
        choices=["exchange", "submitted"],
        default="exchange",
        help="class: hand the class in through nbgrader's exchange (submit, collect; default) or straight into "
        "submitted/ (as zip_collect leaves it)",
    )
    p.set_defaults(func=cmd_bench)

    for name, text in (
        ("lab", "open JupyterLab on the course: the learner notebooks, your kvlib"),
        ("present", "presenters: open the solved notebooks in reference mode (KVLIB_SOLUTIONS=1)"),
    ):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument(
            "notebook", nargs="?", help="a notebook number (01), a part (02b) or a path to open; default: the folder"
        )
        p.add_argument("--port", type=int, help="the port to serve on (default: Jupyter's, 8888 or the next free one)")
        p.add_argument("--no-browser", action="store_true", help="print the URL instead of opening a browser")
        if name == "present":
            p.add_argument(
                "--check",
                action="store_true",
                help="open nothing: run every solution notebook headless, top to bottom, and print the seconds each took",
            )
            p.add_argument(
                "--timeout",
                type=int,
                default=120,
                help="with --check: seconds one cell may take (default 120, as nbgrader_config.py)",
            )
            p.add_argument(
                "--figures", metavar="DIR", help="with --check: save every figure the notebooks show as a PNG in DIR"
            )
        p.set_defaults(func=cmd_present if name == "present" else cmd_lab)

    p = sub.add_parser("course", help="maintainers: build the learner release from solutions/")
    course_sub = p.add_subparsers(dest="course_command", required=True)
    r = course_sub.add_parser("release", help="regenerate kvlib/ stubs and notebooks/ from solutions/")
    r.add_argument("--check", action="store_true", help="write nothing; exit 1 if anything differs")
    r.set_defaults(func=cmd_course_release)
    pl = course_sub.add_parser(
        "plan", help="each notebook's core and going-further minutes and each exercise's, by the sitting estimate"
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
    i = course_sub.add_parser("init", help="instructors: write an nbgrader course folder with isolated grading")
    i.add_argument("dir", help="the course folder to create or update")
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
        help="set up nbgrader's exchange for the course there (e.g. /srv/nbgrader/exchange) and write the students' config",
    )
    i.add_argument(
        "--check",
        action="store_true",
        help="write nothing: say what lets anyone but the folder's owner in (exit 1 if any)",
    )
    i.set_defaults(func=cmd_course_init)
    a = course_sub.add_parser(
        "autograde", help="instructors: grade every collected submission in parallel workers, resumable"
    )
    a.add_argument("assignment", help="the assignment, e.g. 04-kv-cache")
    a.add_argument(
        "--jobs", type=int, default=1, help="parallel workers, one nbgrader start-up each (about one a core)"
    )
    a.add_argument("--student", default="*", help="a glob of student ids (default: everyone who submitted)")
    a.add_argument("--force", action="store_true", help="regrade those already graded at their current submission")
    a.add_argument("--course", default=".", help="the course folder (default: the current one)")
    a.add_argument("--quiet", action="store_true", help="no progress bar")
    a.set_defaults(func=cmd_course_autograde)
    c = course_sub.add_parser(
        "claims",
        help="presenters: run the reference notebooks here and print every claim: holds, does not hold, not decided",
    )
    c.add_argument("notebooks", nargs="*", help="notebook numbers (01 06 ...); default: all")
    c.add_argument("--last", action="store_true", help="run nothing: report the last run's record on this machine")
    c.add_argument("--json", action="store_true", help="print the records as JSON")
    c.add_argument("--timeout", type=int, default=120, help="seconds one cell may take (default 120)")
    c.set_defaults(func=cmd_course_claims)
    e = course_sub.add_parser("export-canvas", help="instructors: the gradebook as a CSV for Canvas's gradebook import")
    e.add_argument("--course", default=".", help="the course folder (default: the current one)")
    e.add_argument("--assignment", action="append", help="only these assignments (repeat; default: all)")
    e.add_argument("--roster", help="a CSV exported from the Canvas gradebook: names, ids and sections to fill in")
    e.add_argument("--to", default="canvas_grades.csv", help="the file to write (- for standard output)")
    e.set_defaults(func=cmd_course_export_canvas)

    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
