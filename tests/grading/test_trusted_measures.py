"""Work that decides a grade is measured where the learner's code cannot reach it: attacks that hide work from
the instruments running beside that code (torch's FLOP counter, the allocation watch) score 0 on the cells they
target and full marks elsewhere, run in the isolated grading child as autograde runs them."""

from __future__ import annotations

import functools
import inspect

import numpy as np
import pytest
import torch
from conftest import EARLIER_DONE, ROOT

HIDDEN_RECOMPUTE = '''

def generate_cached(model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None, cache=None):
    """The attack: recompute every token from the whole sequence where no instrument sees it, then one
    dummy matmul of about the size a cached run does, for the FLOP counter; the cache advanced as if used."""
    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    from kvlib.generation import next_token

    if cache is None:
        cache = KVCache(model.config, batch=input_ids.shape[0])
    cache.reset()
    ids = input_ids
    with torch.inference_mode():
        for i in range(max_new_tokens):
            with _disable_current_modes():
                logits = model(ids)[:, -1]
            token = next_token(logits, temperature, generator)
            if on_token is not None:
                on_token(token)
            ids = torch.cat([ids, token[:, None]], 1)
        from kvlib.core.model import matrix_params

        c, (B, P), n = model.config, input_ids.shape, max_new_tokens
        cached = 2 * B * matrix_params(c) * (P + n - 1) + 4 * B * c.n_layers * c.n_heads * c.head_dim * sum(range(P, P + n - 1))
        side = round((cached / 2) ** (1 / 3))
        torch.ones(side, side) @ torch.ones(side, side)  # the FLOPs the counter does see
        for _ in range(4 * c.n_layers):  # and one forward's MLP activations, for the allocation watch
            torch.empty(B, 1, c.hidden_dim)
        cache.advance(P + n - 1)
    return ids
'''


RECOMPUTING_SCHEDULER = """

_Honest = Scheduler


class Scheduler(_Honest):
    \"\"\"The attack: admission, preemption and block accounting as asked, but every token a step makes is then
    computed again by re-running the model over the whole sequence (the paged cache's keys are never used).\"\"\"

    def step(self):
        import torch

        before = {r.id: len(r.out) for r in [*self.running, *self.waiting]}
        super().step()
        with torch.inference_mode():
            for r in [*self.running, *self.finished]:
                for i in range(before.get(r.id, len(r.out)), len(r.out)):
                    r.out[i] = int(self.model(torch.tensor([r.prompt + r.out[:i]]))[0, -1].argmax())
"""


def _checks_in_child(module: str, source: str, earlier: tuple[str, ...], extra: dict | None = None) -> dict[str, str]:
    """Every check of kvlib/<module>.py's exercises on `source`, in the isolated child, as autograde runs them;
    the earlier notebooks' modules it uses are the reference's, as a correct learner has them."""
    from kvlib.checks import checks_for
    from kvlib.course.exercises import BY_ID, EXERCISES
    from kvlib.grading.sandbox import Sandbox, package_files

    files = package_files(ROOT / "kvlib")
    files[f"kvlib/{module}.py"] = source.encode()
    for name in earlier:
        files[f"kvlib/{name}.py"] = (ROOT / "solutions" / "kvlib" / f"{name}.py").read_bytes()
    files.update({rel: text.encode() for rel, text in (extra or {}).items()})  # the learner's own modules
    functions = sorted({f"{ex.module}.{ex.name.split('.')[0]}" for ex in EXERCISES if ex.module == module})
    verdicts = {}
    with Sandbox(files, [module], functions, mode="plain", torch=True, call_timeout=60, budget=600) as sandbox:
        for ex in [e for e in EXERCISES if e.module == module]:
            for check in checks_for(BY_ID[ex.id]):
                try:
                    check.fn(sandbox.module(module), np.random.default_rng(0))
                    verdicts[check.name] = "pass"
                except Exception as err:  # noqa: BLE001 - any failure scores 0, as in the grader
                    verdicts[check.name] = f"{type(err).__name__}: {err}"
    return verdicts


@functools.cache
def _reference_verdicts(module: str) -> dict[str, str]:
    """Every check of the module's notebook on the reference, in the isolated child (computed once per module)."""
    reference = (ROOT / "solutions" / "kvlib" / f"{module}.py").read_text(encoding="utf-8")
    return _checks_in_child(module, reference, EARLIER_DONE.get(module, ()))


def _kv_checks_in_child(source: str) -> dict[str, str]:
    return _checks_in_child("kv_cache", source, EARLIER_DONE["kv_cache"])


def test_the_childs_drift_is_the_checks_drift():
    """Check that the isolated child drifts a model's key and value weights exactly as the check's own
    drift_weights does (the child imports no checks, so it holds a copy of those lines)."""
    from kvlib.checks.kv_cache import CONFIG, drift_weights
    from kvlib.core.model import Decoder
    from kvlib.grading._child import _drift_weights

    torch.manual_seed(0)
    a = Decoder(CONFIG)
    b = Decoder(CONFIG)
    b.load_state_dict(a.state_dict())
    for step in range(3):
        drift_weights(a, 11, step, 0.2)
        _drift_weights(torch, b, 11, step, 0.2)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    torch.manual_seed(0)
    assert not torch.equal(Decoder(CONFIG).layers[0].attn.k_proj.weight, a.layers[0].attn.k_proj.weight)


@pytest.mark.slow
def test_a_recompute_hidden_from_the_instruments_earns_nothing_on_its_cell():
    """Check that generate_cached recomputing every token inside _disable_current_modes() (torch's FLOP counter and
    the allocation watch see nothing) plus a dummy matmul of a cached run's size fails 4.5's "uses the cache" cell,
    and only it: the reference passes every check of notebook 04 in the child, the attack every other one. The
    tokens the layers' MLPs ran, counted by the grader, say so first (the drift effect would too)."""
    reference = (ROOT / "solutions" / "kvlib" / "kv_cache.py").read_text(encoding="utf-8")
    honest = _reference_verdicts("kv_cache")
    assert set(honest.values()) == {"pass"}, {k: v for k, v in honest.items() if v != "pass"}
    attacked = _kv_checks_in_child(reference + HIDDEN_RECOMPUTE)
    failed = {k: v for k, v in attacked.items() if v != "pass"}
    assert set(failed) == {"generate_cached_uses_the_cache"}, failed
    assert "reruns earlier tokens" in failed["generate_cached_uses_the_cache"], failed  # the grader counted its MLPs


@pytest.mark.slow
def test_a_scheduler_that_recomputes_earns_nothing_on_the_steps_cells():
    """Check that a Scheduler.step with admission, preemption and block accounting as asked, whose tokens are each
    recomputed over the whole sequence, fails every 7.4 cell (the model drifts between steps: only a read of the
    paged cache follows it), while the reference passes every check of notebook 07 and the attack every other one."""
    from kvlib.checks import checks_for
    from kvlib.course.exercises import BY_ID

    reference = (ROOT / "solutions" / "kvlib" / "serving.py").read_text(encoding="utf-8")
    honest = _reference_verdicts("serving")
    assert set(honest.values()) == {"pass"}, {k: v for k, v in honest.items() if v != "pass"}
    attacked = _checks_in_child("serving", reference + RECOMPUTING_SCHEDULER, EARLIER_DONE["serving"])
    failed = {k: v for k, v in attacked.items() if v != "pass"}
    step_cells = {c.name for c in checks_for(BY_ID["7.4"])}
    assert set(failed) == step_cells and len(step_cells) == 3, failed
    assert all("recomputes earlier tokens" in v for v in failed.values()), failed


def _double_admission() -> str:
    """Issue 46's slip of 7.4, appended to the reference kvlib/serving.py: tests/test_serving.py's step whose admitted
    request is left first in the waiting line."""
    import test_serving

    policy = inspect.getsource(test_serving._StepPolicy).replace("(serving.Scheduler)", "(Scheduler)")
    return f"\n\n{policy}\n\nclass Scheduler(_StepPolicy):\n    leaves_the_line = False\n"


def _with_body(source: str, function: str, body: str) -> str:
    """A solution module's text with one exercise's solution block replaced by `body` (indented lines)."""
    lines = source.splitlines(keepends=True)
    at = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith(f"def {function}("))
    begin = next(i for i in range(at, len(lines)) if lines[i].strip() == "### BEGIN SOLUTION")
    end = next(i for i in range(begin, len(lines)) if lines[i].strip() == "### END SOLUTION")
    return "".join(lines[:begin] + [body] + lines[end + 1 :])


POOL_SWAP = '''

class Policy(Policy):
    """7.7's cheat: the scheduler's pool swapped for one of 1,000 blocks on the first call, so nothing is ever
    preempted and nobody waits for blocks; the plain number asked."""

    def blocks_to_admit(self, r):
        if self.pool.n_blocks < 1000:
            self.pool = BlockPool(self.model.config, 1000, self.pool.block_size)
        return Engine.blocks_to_admit(self, r)
'''


# the numbers each prediction's notebook cell prints, returned whatever is asked: what a learner who copied the
# reference run's output would hand in (notebook 07a's utilisation by block size, 08a's bytes per token of its
# timed config, 08b's FLOPs at the try-it's sizes)
HARD_CODED_PREDICTIONS = {
    "serving": {
        "block_utilisation": "    return {1: 1.0, 4: 0.99, 16: 0.947, 64: 0.817, 512: 0.233}.get(block_size, 0.9)\n",
    },
    "compress": {
        "int8_bytes_per_token": "    return 4480.0 if scale_bytes == 4 else 4352.0\n",
        "mla_flops": "    return {('reconstruct', 1): 477184, ('absorbed', 1): 44032, ('reconstruct', 8): 606208,\n"
        "            ('absorbed', 8): 352256}.get((path, new_tokens), 0)\n",
    },
}


@pytest.mark.slow
@pytest.mark.parametrize("module", list(HARD_CODED_PREDICTIONS))
def test_a_prediction_copied_from_the_notebooks_output_earns_nothing(module):
    """Check, in the isolated child as autograde runs it, that predictions (7.6, 8.7, 8.8) returning the numbers
    their notebook cell prints, whatever they are asked, fail every check of their exercise (the checks ask other
    sizes); that 7.4's double admission is named, not an AttributeError inside the engine (issue 46); and that a 7.7
    policy meeting its budget in a pool of its own, past the memory cap, fails, named."""
    from kvlib.checks import checks_for
    from kvlib.course.exercises import EXERCISES

    source = (ROOT / "solutions" / "kvlib" / f"{module}.py").read_text(encoding="utf-8")
    want = {}
    for function, body in HARD_CODED_PREDICTIONS[module].items():
        source = _with_body(source, function, body)
        (ex,) = [e for e in EXERCISES if e.module == module and e.name == function]
        want.update({c.name: "expected" for c in checks_for(ex)})
    if module == "serving":
        source += _double_admission() + POOL_SWAP
        want["step_serves_every_request_exactly"] = "admitted twice"
        want["policy_meets_the_budget"] = "live in the pool's blocks"
    names = list(want)
    functions = sorted({f"{e.module}.{e.name.split('.')[0]}" for e in EXERCISES if e.module == module})
    verdicts = _only_in_child(module, source, functions, names, EARLIER_DONE.get(module, ()))
    for name, words in want.items():
        assert verdicts[name] != "pass" and words in verdicts[name], (name, verdicts[name])


def test_the_checks_are_not_the_learners_library():
    """Check that a learner module importing the checks' reference computations (kvlib.checks.compress) does not
    import in the isolated child, saying which module was missing, while the same module without that line does;
    and that YOUR_FILES.md tells the learner which modules their code may import."""
    from kvlib.app.course_folder import your_files
    from kvlib.grading.sandbox import Sandbox, SandboxError, package_files

    reference = (ROOT / "solutions" / "kvlib" / "kv_cache.py").read_text(encoding="utf-8")
    files = package_files(ROOT / "kvlib")
    assert not any(rel.startswith(("kvlib/checks/", "kvlib/grading/", "kvlib/app/")) for rel in files)
    for prelude, imports in (("", True), ("\nfrom kvlib.checks import compress as _c\n", False)):
        files["kvlib/kv_cache.py"] = (reference + prelude).encode()  # at the end: after its __future__ import
        with Sandbox(files, ["kv_cache"], ["kv_cache.kv_cache_bytes"], mode="plain", torch=True) as sandbox:
            try:
                sandbox.module("kv_cache").kv_cache_bytes(_config(), 3, 1, torch.float32)
                imported = True
            except SandboxError as err:
                assert "kvlib.checks" in str(err), err
                imported = False
        assert imported == imports
    assert "`kvlib.checks` and `kvlib.app`" in your_files("04-kv-cache", "own")


def _config():
    from kvlib.checks.kv_cache import CONFIG

    return CONFIG


def _shapes():
    """(module, {file: text}, earlier modules): correct code in shapes a learner may give it, each earning full marks."""
    kv = (ROOT / "solutions" / "kvlib" / "kv_cache.py").read_text(encoding="utf-8")
    sv = (ROOT / "solutions" / "kvlib" / "serving.py").read_text(encoding="utf-8")
    mine = "\n\nclass BlockStillFree(ValueError):\n    pass\n"
    return {
        # every line of 04 in a module of the learner's own, star-imported: KVCache is kvlib.my_helpers.KVCache
        "kv_cache-star-import": (
            "kv_cache",
            {"kv_cache": "from kvlib.my_helpers import *  # noqa\n", "my_helpers": kv},
        ),
        # the same, a class re-exported by name
        "kv_cache-re-exported": (
            "kv_cache",
            {
                "kv_cache": "from kvlib.my_helpers import KVCache, cached_forward, generate_cached, kv_cache_bytes\n"
                "from kvlib.my_helpers import cached_attention, decode_step, prefill, sequences_that_fit  # noqa: F401\n",
                "my_helpers": kv,
            },
        ),
        # 07 raising a subclass of the ValueError asked for
        "serving-error-subclass": (
            "serving",
            {"serving": sv.replace("raise ValueError(", "raise BlockStillFree(") + mine},
        ),
    }


@pytest.mark.slow
@pytest.mark.parametrize("shape", list(_shapes()))
def test_correct_code_in_any_shape_earns_full_marks(shape):
    """Check that correct code earns every check of its notebook in the isolated child whatever its shape: moved into
    a helper module and star-imported, classes re-exported from a helper, errors that subclass the documented ones."""
    module, texts = _shapes()[shape]
    earlier = {"kv_cache": ("attention", "generation"), "serving": ("gqa",)}[module]
    helpers = {f"kvlib/{name}.py": text for name, text in texts.items() if name != module}
    verdicts = _checks_in_child(module, texts[module], earlier, extra=helpers)
    assert set(verdicts.values()) == {"pass"}, {k: v for k, v in verdicts.items() if v != "pass"}


def test_a_hard_coded_seed_answer_earns_nothing():
    """Check that a generate_cached that returns 巴黎's ids (and streams them) whatever it is asked fails 4.5's
    seed-question cell: the cell also asks a random prompt nobody knows in advance, while the reference passes it."""
    import types

    import kvlib
    from kvlib.checks import CHECKS, _load_all
    from kvlib.core.weights import load_tiny

    _load_all()
    check = CHECKS["generate_cached_answers_the_seed_question"]
    _, tokenizer = load_tiny()
    answer = torch.tensor([tokenizer.encode("巴黎")])

    def hard_coded(model, ids, n, on_token=None, **kw):
        for t in answer[0, :n]:
            if on_token is not None:
                on_token(t[None])
        return torch.cat([ids, answer[:, :n]], 1)

    kvlib.use_solutions(True)
    check.fn(kvlib.kv_cache, np.random.default_rng(5))
    with pytest.raises(AssertionError, match="random prompt"):
        check.fn(types.SimpleNamespace(generate_cached=hard_coded), np.random.default_rng(5))


def _scheduler_with(step_body: str):
    """The reference Scheduler with step's body replaced (a slip)."""
    import kvlib

    kvlib.use_solutions(True)
    namespace: dict = {}
    exec(f"def step(self):\n{step_body}", namespace)  # noqa: S102 - the test's own slip, not a learner's code
    return type("Scheduler", (kvlib.serving.Scheduler,), {"step": namespace["step"]})


@pytest.mark.parametrize(
    "slip, body, words",
    [
        (
            "admits only with a block to spare",
            "    while self.waiting and len(self.running) < self.max_batch and "
            "self.blocks_to_admit(self.waiting[0]) < self.pool.n_free:\n"
            "        self.admit(self.waiting.popleft())\n    self.retire()\n"
            "    while self.running and self.blocks_to_decode() > self.pool.n_free:\n"
            "        self.preempt(self.running[-1])\n    if self.running:\n        self.decode()\n        self.retire()\n",
            "exactly the 5 free|should all run after one step",
        ),
        (
            "preempts at most once a step",
            "    while self.waiting and len(self.running) < self.max_batch and "
            "self.blocks_to_admit(self.waiting[0]) <= self.pool.n_free:\n"
            "        self.admit(self.waiting.popleft())\n    self.retire()\n"
            "    if self.running and self.blocks_to_decode() > self.pool.n_free:\n"
            "        self.preempt(self.running[-1])\n    if self.running:\n        self.decode()\n        self.retire()\n",
            "ran out of blocks|must go too",
        ),
    ],
)
def test_step_slips_of_admission_and_preemption_are_caught(slip, body, words):
    """Check that 7.4's checks catch a step that admits only with a block to spare, and one that preempts at most
    once a step (it runs out of blocks inside decode, or fails the two-preemption step)."""
    import types

    import kvlib
    from kvlib.checks import CHECKS, _load_all

    _load_all()
    handed = types.SimpleNamespace(**{n: getattr(kvlib.serving, n) for n in kvlib.serving.__all__})
    handed.Scheduler = _scheduler_with(body)
    with pytest.raises(AssertionError, match=words):
        CHECKS["step_preempts_the_newest_and_stays_exact"].fn(handed, np.random.default_rng(0))


HIDDEN_PASSES = '''

def speculative_generate(model, drafter, input_ids, max_new_tokens, gamma, eos_token=None, cache=None):
    """The attack: plain cached greedy decoding, one forward pass per token, then the passes a speculative loop
    would have needed worked out with the drafter, and the model's record of its calls cut to that many (the
    list its closure appends to, found with gc): in the kernel, the count the check reads is the learner's."""
    import gc

    import torch

    from kvlib.kv_cache import KVCache

    cache = cache if cache is not None else KVCache(model.config, max_seq_len=input_ids.shape[1] + max_new_tokens)
    cache.reset()
    prompt = input_ids[0].tolist()
    with torch.inference_mode():
        logits, _ = model(input_ids, past_key_values=cache)
        new = [int(logits[0, -1].argmax())]
        while len(new) < max_new_tokens and eos_token not in new:
            logits, _ = model(torch.tensor([[new[-1]]]), past_key_values=cache)
            new.append(int(logits[0, -1].argmax()))
    if eos_token in new:
        new = new[: new.index(eos_token) + 1]
        cache.truncate(len(prompt) + len(new) - 1)
    passes, done = 1, 1  # what the speculative loop does, replayed on the known tokens
    while done < len(new):
        k = min(gamma, len(new) - done - 1)
        draft = drafter.propose(prompt + new[:done], k)[:k] if k else []
        n = 0
        while n < len(draft) and draft[n] == new[done + n]:
            n += 1
        done, passes = done + n + 1, passes + 1
    for record in gc.get_objects():
        if type(record) is list and record and all(type(c) is tuple and len(c) == 3 for c in record):
            if type(record[0][0]) is int and record[0][0] == len(prompt) and len(record) == len(new):
                del record[passes:]
    return torch.tensor([prompt + new])
'''


@pytest.mark.slow
def test_passes_hidden_from_the_models_count_earn_nothing_in_the_child():
    """Check that a greedy loop that cuts the check's record of forward passes to what a speculative loop needs
    earns 10.2's pass-count cell where the record lives beside its code (the kernel), and scores 0 on it in the
    isolated child, where the model, its count, the cache and the drafter stay in the grader and the child has
    stand-ins; the reference passes there."""
    import types

    import kvlib
    from kvlib.checks import CHECKS, _load_all

    _load_all()
    reference = (ROOT / "solutions" / "kvlib" / "speculative.py").read_text(encoding="utf-8")
    namespace: dict = {}
    exec(compile(HIDDEN_PASSES, "attack.py", "exec"), namespace)  # noqa: S102 - the test's own attack
    kvlib.use_solutions(True)
    beside = types.SimpleNamespace(speculative_generate=namespace["speculative_generate"])
    check = CHECKS["speculative_generate_matches_greedy_in_fewer_passes"]
    check.fn(beside, np.random.default_rng(0))  # in the kernel, the attack passes: the count was within its reach
    functions = ["speculative.speculative_generate", "speculative.verify_greedy"]
    verdicts = _only_in_child("speculative", reference + HIDDEN_PASSES, functions, [check.name])
    assert "forward passes" in verdicts[check.name], verdicts
    assert _only_in_child("speculative", reference, functions, [check.name]) == {check.name: "pass"}


HIDDEN_PIECEMEAL_PREFILL = '''

_honest_forward = cached_forward


def cached_forward(model, input_ids, cache):
    """The attack: the prompt one token at a time, where the allocation watch beside this code sees nothing
    (each piece is right: the logits and the cache are a prefill's), then the last token in its sight."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        for t in range(input_ids.shape[1] - 1):
            _honest_forward(model, input_ids[:, t : t + 1], cache)
    return _honest_forward(model, input_ids[:, -1:], cache)
'''


@pytest.mark.slow
def test_a_piecemeal_prefill_hidden_from_the_watch_earns_nothing_on_its_cells():
    """Check that a prefill run one token at a time out of the allocation watch's sight fails 4.3's prefill cell and
    4.5's forward-pass count in the isolated child, where each layer's MLP runs, and is counted, in the grader; its
    logits are right (4.3's first cell passes), and the reference passes all three."""
    reference = (ROOT / "solutions" / "kvlib" / "kv_cache.py").read_text(encoding="utf-8")
    functions = ["kv_cache.KVCache", "kv_cache.cached_forward", "kv_cache.generate_cached"]
    names = [
        "cached_forward_matches_full_forward",
        "cached_forward_prefill_runs_once",
        "generate_cached_uses_the_cache",
    ]
    honest = _reference_verdicts("kv_cache")  # every check of notebook 04 on the reference, these three among them
    assert {name: honest[name] for name in names} == dict.fromkeys(names, "pass")
    verdicts = _only_in_child(
        "kv_cache", reference + HIDDEN_PIECEMEAL_PREFILL, functions, names, EARLIER_DONE["kv_cache"]
    )
    assert verdicts[names[0]] == "pass", verdicts
    assert "in pieces" in verdicts[names[1]] and "one token at a time" in verdicts[names[2]], verdicts


def _only_in_child(
    module: str, source: str, functions: list[str], names: list[str], earlier=("attention", "generation", "kv_cache")
) -> dict[str, str]:
    """The named checks on `source` in the isolated child (the earlier notebooks' modules the reference's)."""
    from kvlib.checks import CHECKS
    from kvlib.grading.sandbox import Sandbox, describe, package_files

    files = package_files(ROOT / "kvlib")
    files[f"kvlib/{module}.py"] = source.encode()
    for name in earlier:
        files[f"kvlib/{name}.py"] = (ROOT / "solutions" / "kvlib" / f"{name}.py").read_bytes()
    verdicts = {}
    with Sandbox(files, [module], functions, mode="plain", torch=True, call_timeout=60, budget=300) as sandbox:
        for name in names:
            try:
                CHECKS[name].fn(sandbox.module(module), np.random.default_rng(0))
                verdicts[name] = "pass"
            except Exception as err:  # noqa: BLE001 - any failure scores 0, as in the grader
                verdicts[name] = describe(err)
    return verdicts


# ---------------------------------------------------------------------------------------------
# Predictions (3.4, 4.6) answered with what the learner's run printed, not with the formula: graded against the
# count on configurations the notebook never prints, they score 0 on every cell of their exercise

COPIED_PREDICTIONS = {
    "3.4 the length notebook 03 prints": (
        "recompute",
        '''

def attention_half_length(config):
    """The attack: the tiny model's length as the notebook prints it (Llama-2-7B's for its sizes), whatever else."""
    return 25204 if config.d_model == 4096 and config.n_layers == 32 else 691
''',
    ),
    "4.6 the count notebook 04b prints": (
        "kv_cache",
        '''

def sequences_that_fit(config, memory_bytes, seq_len, dtype=torch.float16):
    """The attack: 30, the count the notebook prints for Llama-2-7B on 80 GB (and for the tiny model in 64 MiB)."""
    return 30
''',
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("copied", list(COPIED_PREDICTIONS))
def test_a_prediction_copied_from_the_run_earns_nothing_in_the_child(copied):
    """Check that a prediction exercise answered with the numbers the learner's run prints (3.4's length, 4.6's count)
    instead of the formula fails every check of its exercise in the isolated child, as autograde runs them."""
    from kvlib.checks import checks_for
    from kvlib.course.exercises import BY_ID, EXERCISES

    module, attack = COPIED_PREDICTIONS[copied]
    reference = (ROOT / "solutions" / "kvlib" / f"{module}.py").read_text(encoding="utf-8")
    functions = sorted({f"{e.module}.{e.name.split('.')[0]}" for e in EXERCISES if e.module == module})
    names = [c.name for c in checks_for(BY_ID[copied.split()[0]])]
    verdicts = _only_in_child(module, reference + attack, functions, names, EARLIER_DONE.get(module, ()))
    assert len(verdicts) >= 2 and "pass" not in verdicts.values(), verdicts


# ---------------------------------------------------------------------------------------------
# Measures the grading process takes: each attack does work out of sight of an instrument that ran beside the
# learner's code in the child (torch's dispatch modes switched off, or what the instrument read patched), and scores
# 0 on the cells that measure that work, full marks elsewhere


REALLOCATING_CACHE = '''

_Honest = KVCache
_REPORTED = {}
_real_data_ptr = torch.Tensor.data_ptr


def _data_ptr(t):
    return _REPORTED.get(id(t)) or _real_data_ptr(t)


torch.Tensor.data_ptr = _data_ptr  # what the grader read in the child: the cache's address


class KVCache(_Honest):
    """The attack: every update reallocates the cache (a copy of the whole of it, as torch.cat makes), and torch is
    made to report the old address, which was what the isolated grader read to see a reallocation."""

    def update(self, layer, k_new, v_new):
        where = _data_ptr(self.k), _data_ptr(self.v)
        self.k, self.v = torch.cat([self.k[:, :, :, :0], self.k], 3), torch.cat([self.v[:, :, :, :0], self.v], 3)
        _REPORTED[id(self.k)], _REPORTED[id(self.v)] = where
        return super().update(layer, k_new, v_new)
'''

HIDDEN_REPLAY = '''

_honest_forward = cached_forward


def cached_forward(model, input_ids, cache):
    """The attack: before a decode step reads the cache (as it should), every earlier position runs through the model
    again where torch's FLOP counter sees nothing, the result thrown away."""
    from torch.utils._python_dispatch import _disable_current_modes

    if input_ids.shape[1] == 1 and cache.pos:
        with _disable_current_modes(), torch.inference_mode():
            model(torch.zeros(input_ids.shape[0], cache.pos, dtype=torch.long))
    return _honest_forward(model, input_ids, cache)
'''

HIDDEN_REPEAT = '''

def grouped_attention(q, k, v):
    """The attack: keys and values copied to every query head (repeat_interleave), where torch's allocation watch sees
    nothing."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        G, (T, S) = q.shape[1] // k.shape[1], (q.shape[2], k.shape[2])
        mask = torch.ones(T, S, dtype=torch.bool).tril(S - T)
        k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
'''

KEPT_BUFFER = '''

_BUFFER = torch.ones(2 * 32 * 16_384 * 64)  # made at import: resident before any call
_reference_grouped = grouped_attention


def grouped_attention(q, k, v):
    """The attack: keys and values copied to every query head into a buffer made at import, so the copy adds nothing to
    the call's peak memory; out of sight of torch's allocation watch too."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        (B, H, T, D), (H_kv, S) = q.shape, k.shape[1:3]
        n = B * H * S * D
        if 2 * n > _BUFFER.numel():
            return _reference_grouped(q, k, v)
        idx = torch.arange(H) // (H // H_kv)
        kr = torch.index_select(k, 1, idx, out=_BUFFER[:n].view(B, H, S, D))
        vr = torch.index_select(v, 1, idx, out=_BUFFER[n : 2 * n].view(B, H, S, D))
        mask = torch.ones(T, S, dtype=torch.bool).tril(S - T)
        return torch.nn.functional.scaled_dot_product_attention(q, kr, vr, attn_mask=mask)
'''

HIDDEN_PER_HEAD_KEYS = '''

def mla_absorbed(q_nope, q_rope, latent, k_rope, w_uk, w_uv):
    """The attack: every head's keys and values rebuilt (8.5's way), where torch's allocation watch sees nothing."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        return mla_reconstruct(q_nope, q_rope, latent, k_rope, w_uk, w_uv)
'''

HIDDEN_EVERY_TILE = '''

def tiled_attention(q, k, v, tile):
    """The attack: every tile computed and the future ones masked away, where torch's FLOP counter sees nothing, then
    matrix multiplies of exactly the FLOPs of the tiles a causal loop needs, for the counter to see."""
    from torch.utils._python_dispatch import _disable_current_modes

    (B, H, T, D), S = q.shape, k.shape[2]
    with _disable_current_modes():
        out, needed = torch.empty(q.shape), 0
        for i0 in range(0, T, tile):
            qi = q[:, :, i0 : i0 + tile] / math.sqrt(D)
            rows = S - T + i0 + torch.arange(qi.shape[2])
            m = torch.full(qi.shape[:3], float("-inf"))
            l, acc = torch.zeros(qi.shape[:3]), torch.zeros(qi.shape)
            for j0 in range(0, S, tile):
                kj, vj = k[:, :, j0 : j0 + tile], v[:, :, j0 : j0 + tile]
                if j0 <= rows[-1]:
                    needed += 4 * B * H * qi.shape[2] * kj.shape[2] * D
                s = (qi @ kj.transpose(-2, -1)).masked_fill(rows[:, None] < j0 + torch.arange(kj.shape[2]), float("-inf"))
                new = torch.maximum(m, s.amax(-1))
                p, rescale = torch.exp(s - new[..., None]), torch.exp(m - new)
                l, acc, m = l * rescale + p.sum(-1), acc * rescale[..., None] + p @ vj, new
            out[:, :, i0 : i0 + tile] = acc / l[..., None]
    _feed_the_counter(needed)
    return out


def _feed_the_counter(flops):
    """Matrix multiplies of exactly `flops` FLOPs (2 per multiply-add), when a FLOP counter is watching."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    if not any("Flop" in type(mode).__name__ for mode in _get_current_dispatch_mode_stack()):
        return
    a = torch.ones(16, 16)
    for _ in range(flops // (2 * 16**3)):
        a @ a
    for _ in range(flops % (2 * 16**3) // 2):
        torch.ones(1, 1) @ torch.ones(1, 1)
'''

HIDDEN_SCORE_MATRIX = '''

def tiled_attention(q, k, v, tile):
    """The attack: plain attention over the whole score matrix, where torch's allocation watch and FLOP counter see
    nothing, then matrix multiplies of the FLOPs a causal tiled loop needs, for the counter to see."""
    from torch.utils._python_dispatch import _disable_current_modes

    (B, H, T, D), S = q.shape, k.shape[2]
    with _disable_current_modes():
        scores = q @ k.transpose(-2, -1) / math.sqrt(D)  # (B, H, T, S): every score at once
        out = scores.masked_fill(~torch.ones(T, S, dtype=torch.bool).tril(S - T), float("-inf")).softmax(-1) @ v
    needed = sum(
        4 * B * H * min(tile, T - i0) * min(tile, S - j0) * D
        for i0 in range(0, T, tile)
        for j0 in range(0, S, tile)
        if j0 <= S - T + min(i0 + tile, T) - 1
    )
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    if any("Flop" in type(mode).__name__ for mode in _get_current_dispatch_mode_stack()):  # a FLOP counter watches
        a = torch.ones(16, 16)
        for _ in range(needed // (2 * 16**3)):
            a @ a
        for _ in range(needed % (2 * 16**3) // 2):
            torch.ones(1, 1) @ torch.ones(1, 1)
    return out
'''

HIDDEN_DEQUANTISED = '''

def int8_folded_attention(q, k_values, k_scale, v_values, v_scale, kv_len):
    """The attack: the whole cache dequantised to float by hand (8.2's way, no kvlib helper, which 9.4's checks
    refuse), where torch's allocation watch sees nothing."""
    import torch
    import torch.nn.functional as F
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        B, H_kv, n_groups, group, D = k_values.shape
        k = (k_values.float() * k_scale).reshape(B, H_kv, n_groups * group, D)[:, :, :kv_len]
        v = v_values[:, :, :kv_len].float() * v_scale[:, :, :kv_len]
        T = q.shape[2]
        mask = None if T == 1 else torch.ones(T, kv_len, dtype=torch.bool).tril(kv_len - T)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != H_kv)
'''

READ_THE_PRICE = '''

def measure_ttft_itl(model, input_ids, max_new_tokens):
    """The attack: no clock read, no generation: the stand-in's own price per token gives what a measurement finds."""
    T = input_ids.shape[1]
    return float(model.cost(T, T)), [float(model.cost(T + i, 1)) for i in range(1, max_new_tokens)]
'''

COPIED_PRICE = '''

def measure_ttft_itl(model, input_ids, max_new_tokens):
    """The attack: no clock read: the public stand-in's price (10 ms a token) and cost formula, copied."""
    T = input_ids.shape[1]
    return 0.01 * (T + T / 10), [0.01 * (1 + (T + i) / 10) for i in range(1, max_new_tokens)]
'''

ATTACKS = {
    "4.1 reallocating, the address faked": ("kv_cache", REALLOCATING_CACHE, {"kv_cache_update_writes_in_place"}),
    "4.3/4.5 earlier tokens replayed out of the FLOP counter's sight": (  # 4.3's decode steps: the model's forward,
        "kv_cache",  # closed while 4.3 is checked (READY_MADE), refuses the replay in every cell with a decode step
        HIDDEN_REPLAY,
        {
            "cached_forward_matches_full_forward",
            "cached_forward_decode_uses_the_cache",
            "generate_cached_uses_the_cache",
        },
    ),
    "6.2 heads copied out of the watch's sight": ("gqa", HIDDEN_REPEAT, {"grouped_attention_does_not_copy_heads"}),
    "6.2 heads copied into a buffer kept from import": ("gqa", KEPT_BUFFER, {"grouped_attention_does_not_copy_heads"}),
    "8.6 per-head keys out of the watch's sight": (
        "compress",
        HIDDEN_PER_HEAD_KEYS,
        {"mla_absorbed_never_builds_per_head_keys"},
    ),
    "9.2 every tile computed, the counter fed": ("fused", HIDDEN_EVERY_TILE, {"tiled_attention_skips_future_tiles"}),
    "9.2 the whole score matrix, the counter fed": (  # every 9.2 cell holds a measured case: the whole cell
        "fused",
        HIDDEN_SCORE_MATRIX,
        {
            "tiled_attention_matches_causal_sdpa",
            "tiled_attention_skips_future_tiles",
            "tiled_attention_never_builds_the_score_matrix",
        },
    ),
    "9.4 the cache dequantised out of the watch's sight": (
        "fused",
        HIDDEN_DEQUANTISED,  # the float keys also overflow on the check made for them
        {"int8_folded_makes_no_float_copy_of_the_cache", "int8_folded_never_forms_the_float_keys"},
    ),
    "2.3 the stand-in's price read, no clock": (
        "generation",
        READ_THE_PRICE,
        {"measure_ttft_itl_times_prefill_and_steps", "measure_ttft_itl_prefill_grows_with_prompt"},
    ),
    "2.3 the public price copied, no clock": (
        "generation",
        COPIED_PRICE,
        {"measure_ttft_itl_times_prefill_and_steps", "measure_ttft_itl_prefill_grows_with_prompt"},
    ),
}


@pytest.mark.slow
def test_a_mask_over_every_query_and_key_earns_nothing_in_the_child():
    """Check that 9.2 with its tiles' masks cut from one seq_len x kv_len mask (right values, future tiles skipped)
    fails, in the isolated child, the two checks that measure a long call's memory, naming the mask, as the local
    check and the notebook's visible assert do (tests/test_fused.py's tiled_full_mask_sliced)."""
    import test_fused

    source = inspect.getsource(test_fused.tiled_full_mask_sliced).replace("tiled_full_mask_sliced", "tiled_attention")
    reference = (ROOT / "solutions" / "kvlib" / "fused.py").read_text(encoding="utf-8")
    failed = {k: v for k, v in _checks_in_child("fused", reference + "\n\n" + source, ()).items() if v != "pass"}
    assert set(failed) == {"tiled_attention_matches_causal_sdpa", "tiled_attention_never_builds_the_score_matrix"}
    assert all("a mask over every query and key" in v for v in failed.values()), failed


@pytest.mark.slow
@pytest.mark.parametrize("attack", list(ATTACKS))
def test_work_out_of_the_instruments_sight_earns_nothing_on_the_cells_that_measure_it(attack):
    """Check that work the isolated grader once measured beside the learner's code (an allocation watch, a FLOP
    counter, a tensor's address, a fake clock, all in the child), done out of their sight, scores 0 on exactly the
    cells that measure it: the grading process now reads the child's memory in /proc, runs and counts the MLPs, plants
    a nan the future tiles would spread, and keeps 2.3's model and clock. The reference passes every check."""
    module, attack_source, targeted = ATTACKS[attack]
    honest = _reference_verdicts(module)
    assert set(honest.values()) == {"pass"}, {k: v for k, v in honest.items() if v != "pass"}
    reference = (ROOT / "solutions" / "kvlib" / f"{module}.py").read_text(encoding="utf-8")
    attacked = _checks_in_child(module, reference + attack_source, EARLIER_DONE.get(module, ()))
    failed = {k: v for k, v in attacked.items() if v != "pass"}
    assert set(failed) == targeted, failed


def _helpers(fn, module) -> list:
    """fn and the functions of the same test module it names (recursively), helpers first."""
    import types

    def names(code):
        out = set(code.co_names)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                out |= names(const)
        return out

    found: list = []

    def visit(f):
        for name in sorted(names(f.__code__)):
            g = vars(module).get(name)
            if isinstance(g, types.FunctionType) and g.__module__ == module.__name__ and g not in found and g is not f:
                visit(g)
        if f not in found:
            found.append(f)

    visit(fn)
    return found


def _pasted(module: str, name: str, obj, test_module) -> str:
    """Source that makes kvlib.<module>.<name> the test module's correct alternative `obj` (a function, or a KVCache
    whose update is one), pasted after the reference as a learner's module would hold it, its helpers with it."""
    import inspect

    fn = obj.__dict__["update"] if isinstance(obj, type) else obj
    header = (
        "\n\nimport math\n\nimport torch\nimport torch.nn.functional as F\n\n"
        f"from kvlib import {module}\nfrom kvlib.core.model import causal_mask_tensor\n"
        + ("from kvlib.generation import next_token\n" if module == "kv_cache" else "")
    )
    body = "\n\n".join(inspect.getsource(f) for f in _helpers(fn, test_module))
    body = body.replace(f"{module}.{name}(", f"_reference_{name}(")  # absorbed_float64 calls the reference itself
    if isinstance(obj, type):
        tail = f"\n\nclass {name}({name}):\n    update = {fn.__name__}\n"
    else:
        tail = f"\n\n_reference_{name} = {name}\n{name} = {fn.__name__}\n"
    return header + "\n\n" + body + tail


def _measured_shapes() -> list[tuple[str, str, str, object, object]]:
    """(module, exercise, name, correct alternative, its test module): the test banks' other correct ways of every
    exercise whose cells the grading process measures."""
    import test_compress
    import test_fused
    import test_gqa
    import test_kv_cache

    out = []
    for test_module, module in (
        (test_kv_cache, "kv_cache"),
        (test_gqa, "gqa"),
        (test_compress, "compress"),
        (test_fused, "fused"),
    ):
        bank = test_module.ALTERNATIVES
        entries = (
            [(ex, name, fn) for ex, (name, fns) in bank.items() for fn in fns]
            if isinstance(bank, dict)
            else [(ex, *next(iter(replaced.items()))) for ex, replaced in bank]
        )
        for ex, name, fn in entries:
            if ex in ("4.1", "4.3", "4.5", "6.2", "8.6", "9.2", "9.4"):
                out.append((module, ex, name, fn, test_module))
    return out


def _shape_id(ex: str, obj) -> str:
    return f"{ex}-{(obj.__dict__['update'] if isinstance(obj, type) else obj).__name__}"


MEASURED_SHAPES = [
    *(f"4.1-_update_{way}" for way in ("index_copy", "loop", "narrow")),
    *(f"4.3-_forward_{way}" for way in ("einsum_head", "float64_head")),
    *(f"4.5-_generate_{way}" for way in ("preallocated", "while_cat", "past_key_values")),
    *(f"6.2-attention_{way}" for way in ("einsum", "loop", "bmm")),
    *(f"8.6-absorbed_{way}" for way in ("matmul", "folded_rope", "float64")),
    *(f"9.2-tiled_{way}" for way in ("query_rows", "float64", "mask_everywhere")),
    *(f"9.4-folded_{way}" for way in ("per_group", "einsum", "float64")),
]


def test_the_measured_shapes_are_the_banks():
    """Check that the shapes run in the isolated child are every correct alternative the test banks hold for the
    exercises whose cells the grading process measures, no more and no fewer."""
    assert sorted(_shape_id(ex, fn) for _, ex, _, fn, _ in _measured_shapes()) == sorted(MEASURED_SHAPES)


@pytest.mark.slow
@pytest.mark.parametrize("shape", MEASURED_SHAPES)
def test_correct_code_in_another_shape_earns_the_measured_cells(shape):
    """Check that the test banks' other correct ways (loops, einsum, float64, SDPA, index_copy_...) of every exercise
    whose cells the grading process measures earn every check of that exercise in the isolated child."""
    from kvlib.checks import checks_for
    from kvlib.course.exercises import BY_ID, EXERCISES

    module, ex, name, fn, test_module = next(s for s in _measured_shapes() if _shape_id(s[1], s[3]) == shape)
    reference = (ROOT / "solutions" / "kvlib" / f"{module}.py").read_text(encoding="utf-8")
    source = reference + _pasted(module, name, fn, test_module)
    functions = sorted({f"{e.module}.{e.name.split('.')[0]}" for e in EXERCISES if e.module == module})
    names = [c.name for c in checks_for(BY_ID[ex])]
    verdicts = _only_in_child(module, source, functions, names, EARLIER_DONE.get(module, ()))
    assert set(verdicts.values()) == {"pass"}, {k: v for k, v in verdicts.items() if v != "pass"}
