"""Work that decides a grade is measured where the learner's code cannot reach it: attacks that hide work from
the instruments running beside that code (torch's FLOP counter, the allocation watch) score 0 on the cells they
target and full marks elsewhere, run in the isolated grading child as autograde runs them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import ROOT

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


def _kv_checks_in_child(source: str) -> dict[str, str]:
    return _checks_in_child("kv_cache", source, ("attention", "generation"))


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
    and only it: the reference passes every check of notebook 04 in the child, the attack every other one."""
    reference = (ROOT / "solutions" / "kvlib" / "kv_cache.py").read_text(encoding="utf-8")
    honest = _kv_checks_in_child(reference)
    assert set(honest.values()) == {"pass"}, {k: v for k, v in honest.items() if v != "pass"}
    attacked = _kv_checks_in_child(reference + HIDDEN_RECOMPUTE)
    failed = {k: v for k, v in attacked.items() if v != "pass"}
    assert set(failed) == {"generate_cached_uses_the_cache"}, failed
    assert "recomputes earlier tokens" in failed["generate_cached_uses_the_cache"], failed


@pytest.mark.slow
def test_a_scheduler_that_recomputes_earns_nothing_on_the_steps_cells():
    """Check that a Scheduler.step with admission, preemption and block accounting as asked, whose tokens are each
    recomputed over the whole sequence, fails every 7.4 cell (the model drifts between steps: only a read of the
    paged cache follows it), while the reference passes every check of notebook 07 and the attack every other one."""
    from kvlib.checks import checks_for
    from kvlib.course.exercises import BY_ID

    reference = (ROOT / "solutions" / "kvlib" / "serving.py").read_text(encoding="utf-8")
    honest = _checks_in_child("serving", reference, ("gqa",))
    assert set(honest.values()) == {"pass"}, {k: v for k, v in honest.items() if v != "pass"}
    attacked = _checks_in_child("serving", reference + RECOMPUTING_SCHEDULER, ("gqa",))
    failed = {k: v for k, v in attacked.items() if v != "pass"}
    step_cells = {c.name for c in checks_for(BY_ID["7.4"])}
    assert set(failed) == step_cells and len(step_cells) == 3, failed
    assert all("recomputes earlier tokens" in v for v in failed.values()), failed


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
                "from kvlib.my_helpers import cached_attention, decode_step, prefill  # noqa: F401\n",
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
    earlier = ("attention", "generation")
    assert _only_in_child("kv_cache", reference, functions, names, earlier) == dict.fromkeys(names, "pass")
    verdicts = _only_in_child("kv_cache", reference + HIDDEN_PIECEMEAL_PREFILL, functions, names, earlier)
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
