"""Notebooks 02 to 10 graded by nbgrader from a `kvlib course init` folder: a correct submission gets
every point (in 04 also one with code moved into a helper module of the learner's own), the
untouched release and a submission that patches the checks in its kernel get none; in 03, 04, 05, 06, 07, 09
and 10 also BANK's cheats (05 and 06: a prediction hard-coded; 07: a copy-on-write that copies nothing; 04: 4.3's
shipped bug left in), library shortcuts and other right ways, each scored cell by cell, in the same autograde run; in
02 the shortcuts a fresh
reader found (2.4's layer echoed, 2.8's decoder built on the meta device, 2.2's tokens reported after the loop, 2.4's
steps taken by the layer's project_q and project_kv). (Notebook 01, with its many attacks:
tests/grading/test_attacks.py.)"""

from __future__ import annotations

import re
import shutil

import pytest
from conftest import EARLIER_DONE, ROOT, nbgrader, run_kvlib

from kvlib.app.class_bench import points
from kvlib.course.exercises import EXERCISES
from kvlib.grading.checks_registry import PROXYABLE_MODULES

pytestmark = pytest.mark.slow


PATCHING_PRELUDE = """
try:  # in the kernel, every later cell (visible asserts and hidden grade() alike) just prints "passed"
    from IPython import get_ipython as _gi
    _gi().input_transformers_cleanup.append(lambda lines: ['print("passed")\\n'])
except Exception:
    pass
try:  # and should a check run in this process: make it pass, and grade() print "passed"
    import kvlib.checks as _checks
    _checks.grade = lambda *a, **k: print("passed")
    for _name in _checks.CHECK_MODULES:
        _mod = __import__(f"kvlib.checks.{_name}", fromlist=["x"])
        for _attr in dir(_mod):
            if not _attr.startswith("__") and callable(getattr(_mod, _attr)):
                setattr(_mod, _attr, lambda *a, **k: None)
except Exception:
    pass
"""


def _stub_with(module: str, prelude: str, body: str) -> str:
    """kvlib/<module>.py: every exercise returns `body` instead of its solution; `prelude` runs at import."""
    out, skipping = [], False
    for line in (ROOT / "solutions" / "kvlib" / f"{module}.py").read_text(encoding="utf-8").splitlines(keepends=True):
        if line.strip() == "### BEGIN SOLUTION":
            out.append(line[: len(line) - len(line.lstrip())] + body + "\n")
            skipping = True
        elif line.strip() == "### END SOLUTION":
            skipping = False
        elif not skipping:
            out.append(line)
    return "".join(out).replace(
        "from kvlib.course.exercises import exercise\n", "from kvlib.course.exercises import exercise\n" + prelude, 1
    )


def _with_helper_module(module: str, exercise_id: str, helper: str) -> tuple[str, str]:
    """The issue-15 learner: the reference kvlib/<module>.py with Exercise exercise_id's code moved into a
    module of their own, kvlib/my_helpers.py (as helper(...)), which the exercise calls. Returns both files."""
    import re

    text = (ROOT / "solutions" / "kvlib" / f"{module}.py").read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    at = next(i for i, ln in enumerate(lines) if ln.strip().startswith(f'@exercise("{exercise_id}"'))
    sig = next(i for i in range(at, len(lines)) if lines[i].lstrip().startswith("def "))
    params = re.match(r"\s*def \w+\((.*)", "".join(lines[sig : sig + 4]).replace("\n", " "))
    names = [p.split(":")[0].split("=")[0].strip() for p in _top_level_split(params.group(1).split(")")[0])]
    names = [n for n in names if n and n not in ("self", "*")]
    begin = next(i for i in range(sig, len(lines)) if lines[i].strip() == "### BEGIN SOLUTION")
    end = next(i for i in range(begin, len(lines)) if lines[i].strip() == "### END SOLUTION")
    indent = lines[begin][: len(lines[begin]) - len(lines[begin].lstrip())]
    body = "".join("    " + ln[len(indent) :] if ln.strip() else ln for ln in lines[begin + 1 : end])
    imports = "".join(ln for ln in lines if ln.startswith(("import ", "from ")) and "__future__" not in ln)
    helper_text = f"{imports}\n\ndef {helper}({', '.join(names)}):\n{body}"
    call = f"{indent}return {helper}({', '.join(names)})\n"
    learner = "".join(lines[:begin] + [call] + lines[end + 1 :])
    learner = "".join(
        ln for ln in learner.splitlines(keepends=True) if ln.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION")
    )
    anchor = "from kvlib.course.exercises import exercise\n"
    return learner.replace(anchor, anchor + f"from kvlib.my_helpers import {helper}\n", 1), helper_text


def _top_level_split(params: str) -> list[str]:
    """A parameter list split at its top-level commas (not those inside brackets)."""
    out, depth, cur = [], 0, ""
    for ch in params:
        depth += ch in "([{" and 1 or (-1 if ch in ")]}" else 0)
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return out + [cur]


# ---------------------------------------------------------------------------------------------
# Cheats, library shortcuts and other right ways (issue 47), handed in beside the submissions above and graded in the
# same autograde run. Each is the reference with functions redefined by code appended to it, the exercises it does
# not need left as stubs (their checks fail at once). What each exercise's cell must come to: "full", 0, or the
# names of the checks that must fail (the others pass), with words each failure names.

CHEAT_09_MODES_OFF = '''

def online_softmax(chunks):
    """9.1 cheat: the chunks concatenated where torch's dispatch modes (the allocation watch of old) see nothing."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        s, v = torch.cat([c[0] for c in chunks], -1), torch.cat([c[1] for c in chunks], -2)
        return (s.softmax(-1)[..., None, :] @ v).squeeze(-2)


def tiled_attention(q, k, v, tile):
    """9.2 cheat: torch's attention for each tile of queries over the keys it sees, out of the watch's sight."""
    from torch.utils._python_dispatch import _disable_current_modes

    T, S = q.shape[2], k.shape[2]
    out = torch.empty(q.shape)
    with _disable_current_modes():
        for i0 in range(0, T, tile):
            qi, last = q[:, :, i0 : i0 + tile], S - T + i0 + min(tile, T - i0)
            mask = torch.ones(qi.shape[2], last, dtype=torch.bool).tril(last - qi.shape[2])
            out[:, :, i0 : i0 + qi.shape[2]] = torch.nn.functional.scaled_dot_product_attention(
                qi, k[:, :, :last], v[:, :, :last], attn_mask=mask
            )
    return out
'''

CHEAT_09_FRAMES = '''

def online_softmax(chunks):
    """9.1 cheat: zeros of the right shape when the caller's frames show a watch or a measured call, else the chunks
    concatenated."""
    import sys

    frame, watched = sys._getframe(1), type(chunks) is not list
    while frame is not None:
        watched |= frame.f_code.co_name in ("new_tensors", "peak_tensor_bytes", "_serve")
        frame = frame.f_back
    first = chunks[0]
    if watched:
        return torch.zeros(first[1].shape[:-2] + first[1].shape[-1:])
    s, v = torch.cat([c[0] for c in chunks], -1), torch.cat([c[1] for c in chunks], -2)
    return (s.softmax(-1)[..., None, :] @ v).squeeze(-2)


def tiled_attention(q, k, v, tile):
    """9.2 cheat: torch's fused kernel brought back (every dispatcher registration gc finds dropped, the kernel asked
    for by name), then one call of torch's attention over the whole sequence, through torch.ops."""
    import gc

    for lib in [o for o in gc.get_objects() if type(o).__name__ in ("Library", "_DispatchModule")]:
        try:
            (lib._destroy if hasattr(lib, "_destroy") else lib.reset)()
        except Exception:
            pass
    T, S = q.shape[2], k.shape[2]
    if T == S:
        kernel = torch.library.get_kernel("aten::_scaled_dot_product_flash_attention_for_cpu", "CPU")
        return kernel.call_boxed(torch._C._dispatch_keyset_full(), q, k, v, 0.0, True)[0]
    return torch.ops.aten.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(T, S, dtype=torch.bool).tril(S - T))


def flash_decode_splits(kv_len, n_kv_heads, batch, n_sms):
    """9.5 cheat: the splits notebook 09b prints for an H100 SXM, copied, whatever is asked."""
    return 16


def int8_folded_attention(q, k_values, k_scale, v_values, v_scale, kv_len):
    """9.4 shortcut: flash-decoding's pattern (chunk_partial per group, merged by 9.3) over notebook 08's dequantize,
    one group at a time: never a float copy of the whole cache, but float keys all the same (refused while checked)."""
    from kvlib.compress import dequantize

    group, parts = k_values.shape[3], []
    for g in range(-(-kv_len // group)):
        end = min(kv_len, (g + 1) * group)
        k = dequantize(k_values[:, :, g], k_scale[:, :, g])[:, :, : end - g * group]
        parts.append(chunk_partial(q, k, dequantize(v_values[:, :, g * group : end], v_scale[:, :, g * group : end])))
    return merge_partials(torch.stack([o for o, _ in parts]), torch.stack([lse for _, lse in parts]))[0]
'''

CHEAT_09_THREADS = '''

def _in_a_thread(work):
    import threading

    out = []
    thread = threading.Thread(target=lambda: out.append(work()))
    thread.start()
    thread.join()
    return out[0]


def online_softmax(chunks):
    """9.1 cheat: the chunks concatenated in numpy, in another thread."""
    import numpy as np

    def work():
        s = np.concatenate([c[0].numpy() for c in chunks], -1).astype(np.float64)
        v = np.concatenate([c[1].numpy() for c in chunks], -2)
        p = np.exp(s - s.max(-1, keepdims=True))
        return torch.from_numpy(np.einsum("...s,...sd->...d", p / p.sum(-1, keepdims=True), v)).float()

    return _in_a_thread(work)


def tiled_attention(q, k, v, tile):
    """9.2 cheat: each tile of queries against all the keys it sees at once, in numpy, in another thread."""
    import numpy as np

    def work():
        (T, D), S = q.shape[2:], k.shape[2]
        qn, kn, vn, out = q.numpy(), k.numpy(), v.numpy(), np.empty(q.shape, np.float32)
        for i0 in range(0, T, tile):
            tq, last = min(tile, T - i0), S - T + i0 + min(tile, T - i0)
            s = qn[:, :, i0 : i0 + tq] @ kn[:, :, :last].swapaxes(-1, -2) / np.sqrt(D)
            s = np.where(S - T + i0 + np.arange(tq)[:, None] >= np.arange(last), s, -np.inf)
            p = np.exp(s - s.max(-1, keepdims=True))
            out[:, :, i0 : i0 + tq] = (p / p.sum(-1, keepdims=True)) @ vn[:, :, :last]
        return torch.from_numpy(out)

    return _in_a_thread(work)
'''

CHEAT_10_FRAMES = '''

def accept_sampled(p, q, draft, generator=None):
    """10.3 cheat: one draw from the generator, thrown away (it moves); the round's place in the grader's batch, read
    from the caller's frame, picks a point of an evenly spread sequence, so rates and frequencies come out as expected."""
    import sys

    torch.rand((), generator=generator)
    frame, place = sys._getframe(1), 0
    while frame is not None:
        if isinstance(frame.f_locals.get("results"), list):
            place = len(frame.f_locals["results"])
            break
        frame = frame.f_back
    u = [(place * 0.6180339887 + 0.3819660113 * i) % 1.0 for i in range(len(draft) + 2)]

    def pick(row, x):
        return min(int(torch.searchsorted(torch.cumsum(row.double(), 0), torch.tensor([x]).double())), len(row) - 1)

    for i, token in enumerate(draft):
        if u[i] * float(q[i, token]) < float(p[i, token]):
            continue
        rest = (p[i] - q[i]).clamp(min=0)
        return list(draft[:i]) + [pick(rest / rest.sum(), u[-1])]
    return list(draft) + [pick(p[len(draft)], u[-1])]


def tokens_per_pass(alpha, gamma):
    """10.5 cheat: the tokens a pass made in notebook 10b's run, copied, whatever is asked."""
    return 4.2
'''

VERIFY_PAST_A_MISMATCH_10 = '''

def verify_greedy(model, cache, last_token, draft):
    """10.1, half fixed: the cache rewound right, but every draft the model agrees with counted, even past the first
    one it rejected (the new check's case: a wrong draft, then one the model predicts after it)."""
    start = cache.pos
    with torch.inference_mode():
        logits, _ = model(torch.tensor([[last_token, *draft]]), past_key_values=cache)
    predicted = logits[0].argmax(-1).tolist()
    n = sum(d == p for d, p in zip(draft, predicted))
    cache.truncate(start + n + 1)
    return n, predicted[n]
'''

SHORTCUT_06 = '''

def repeat_kv(x, group_size):
    """6.1's shipped bug fixed another way than the reference: the copies stacked on a new axis after the heads."""
    return torch.stack([x] * group_size, dim=2).flatten(1, 2)


def grouped_attention(q, k, v):
    """6.2's library shortcut: torch's attention reads each shared head in place (its fused kernel does)."""
    T, S = q.shape[2], k.shape[2]
    mask = torch.ones(T, S, dtype=torch.bool).tril(S - T)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
'''

SHORTCUT_04 = '''

def cached_forward(model, input_ids, cache):
    """4.3's library shortcut: the model's own cached forward runs the layer loop."""
    logits, _ = model(input_ids, past_key_values=cache)
    return logits[:, -1]


def cached_attention(attn, x, cache, layer, rope_cos, rope_sin):
    """4.2's ready-made answer: the infrastructure's own attention through a cache."""
    from kvlib.core.cache import attention_through_cache

    return attention_through_cache(attn, x, cache, layer, rope_cos, rope_sin)


def kv_cache_bytes(config, seq_len, batch=1, dtype=torch.float16):
    """4.4's ready-made answer: a one-token cache made, and its bytes measured."""
    return KVCache(config, batch, 1, dtype).nbytes * seq_len
'''


def _shipped_04() -> str:
    """4.3 as the release ships it (kvlib/kv_cache.py's find-and-fix body), redefined after the reference."""
    stub = (ROOT / "kvlib" / "kv_cache.py").read_text(encoding="utf-8")
    return "\n\n" + stub[stub.index('@exercise("4.3"') : stub.index("\n\n\ndef prefill")] + "\n"


SHORTCUT_03 = '''

def forward_flops(config, seq_len):
    """3.1's ready-made answer: torch's count of a model built for the config (its docstring's example once)."""
    from kvlib.core.model import Decoder

    return measured_forward_flops(Decoder(config), seq_len)


def attention_half_length(config):
    """3.4's ready-made answer: a search with torch's share, on a model built for the config."""
    from dataclasses import replace

    from kvlib.core.model import Decoder

    model, T = Decoder(replace(config, max_seq_len=4096)), 1
    while measured_attention_share(model, T) < 0.5:
        T += 1
    return T
'''


def _alternatives(module: str, exercises: dict) -> str:
    """The reference's module with other right ways pasted over it: {exercise: (test module, function name)}."""
    import importlib

    from test_trusted_measures import _pasted

    from kvlib.course.exercises import BY_ID

    return "".join(
        _pasted(module, BY_ID[ex].name, getattr(importlib.import_module(test), fn), importlib.import_module(test))
        for ex, (test, fn) in exercises.items()
    )


CHEATS_02 = '''

def generate(model, input_ids, max_new_tokens, temperature=0.0, generator=None, on_token=None):
    """2.2's slip a fresh reader found: every token reported to on_token once the loop is over."""
    ids = input_ids
    with torch.inference_mode():
        for _ in range(max_new_tokens):
            ids = torch.cat([ids, next_token(model(ids)[:, -1], temperature, generator)[:, None]], dim=1)
    for token in ids[:, input_ids.shape[1] :].T:
        if on_token is not None:
            on_token(token)
    return ids


def attention_block(attn, h, cos, sin, self_attention=None):
    """2.4's cheat: the layer's own forward, returned as it is."""
    with torch.no_grad():
        return attn(h, cos, sin)


def param_counts(config):
    """2.8's cheat: a decoder built on torch's meta device (no memory), its parameters counted."""
    from kvlib.core.model import Decoder, counted_params

    with torch.device("meta"):
        return counted_params(Decoder(config))


def rms_norm(x, weight, eps=1e-5):
    """2.5's shortcut: the model's own RMSNorm, run (refused while 2.5 runs: kvlib.course.exercises.READY_MADE)."""
    from kvlib.core.model import RMSNorm

    norm = RMSNorm(x.shape[-1], eps).to(weight.dtype)
    with torch.no_grad():
        norm.weight.copy_(weight)
    return norm(x)


def swiglu(x, w_gate, w_up, w_down):
    """2.6's shortcut: the model's own MLP, run (refused while 2.6 runs: kvlib.course.exercises.READY_MADE)."""
    from kvlib.core.model import MLP, ModelConfig

    mlp = MLP(ModelConfig(2, d_model=w_gate.shape[1], n_heads=1, n_kv_heads=1, hidden_dim=w_gate.shape[0]))
    with torch.no_grad():
        for linear, w in ((mlp.gate_proj, w_gate), (mlp.up_proj, w_up), (mlp.down_proj, w_down)):
            linear.to(w.dtype).weight.copy_(w)
    return mlp(x)
'''

CHEAT_02_STEPS = '''

def attention_block(attn, h, cos, sin, self_attention=None):
    """2.4's route a fresh reader found: the layer's own project_q and project_kv, the given attention, o_proj."""
    B, T, _ = h.shape
    with torch.no_grad():
        q, (k, v) = attn.project_q(h, cos, sin), attn.project_kv(h, cos, sin)
        out, _ = self_attention(q.numpy(), k.numpy(), v.numpy())
        return attn.o_proj(torch.from_numpy(out).transpose(1, 2).reshape(B, T, -1))
'''


def _shipped(module: str, name: str) -> str:
    """A find-and-fix exercise's function as the release ships it in kvlib/<module>.py (its bug in it), undecorated."""
    import ast

    source = (ROOT / "kvlib" / f"{module}.py").read_text(encoding="utf-8")
    (node,) = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name]
    lines = source.splitlines(keepends=True)[node.lineno - 1 : node.end_lineno]  # from `def`: no decorator
    return "\n\n" + "".join(lines)


HARD_CODED_05 = '''

def compute_bound_batch(config, kv_len, peak_flops, bandwidth, dtype=None):
    """The cheat: 5.5's prediction written as the number its docstring's example prints, whatever it is asked."""
    return 299


def ridge_batch(k, n, peak_flops, bandwidth, dtype=torch.float16):
    """5.2's shortcut: a search over m with 5.1 up to a cap, None past it (the limit the text describes never used)."""
    for m in range(1, 10**5 + 1):
        if matmul_intensity(m, k, n, dtype) >= peak_flops / bandwidth:
            return m
    return None


def predicted_tokens_per_second(config, kv_len, batch, dtype, peak_flops, bandwidth):
    """5.4 through the notebooks' own roofline time (kvlib.measure.machine.roofline_time): refused while 5.4 runs."""
    from kvlib.measure.machine import roofline_time

    return batch / roofline_time(*step_cost(config, 1, kv_len, batch, dtype), peak_flops, bandwidth)
'''

HARD_CODED_06 = '''

def predicted_speedup(config, n_kv_heads, kv_len, batch=1):
    """The cheat: 6.5's prediction written as the number its try cell prints, whatever it is asked."""
    return 2.8716


_reference_grouped_attention = grouped_attention


def grouped_attention(q, k, v):
    """6.2's ready-made answer: a decode step handed to the benchmark's split-K attention (refused while 6.2 runs)."""
    from kvlib.variants.gqa_attention import split_k_attention

    return split_k_attention(q, k, v) if q.shape[2] == 1 else _reference_grouped_attention(q, k, v)
'''

SERVING_07 = '''

def copy_on_write(pool, table, index):
    """7.5's slip: the shared block kept as it is; in this engine most writes into one rewrite what it holds, so only
    a write that differs (a prompt extending another's) shows it."""
    return table.blocks[index]


class Policy(Scheduler):
    """7.7 another right way: 3 blocks kept back while others run, and the oldest preempted."""

    def blocks_to_admit(self, r):
        return Scheduler.blocks_to_admit(self, r) + (3 if self.running else 0)

    def victim(self):
        return self.running[0]
'''

# module -> student -> (code appended to the reference, exercises kept, {exercise: "full" | 0 | {check: words} |
# (words, ...): a find-and-fix cell scoring 0, its error holding each})
BANK = {
    "generation": {  # 2.3 times the module's own generate: one that reports after its loop leaves TTFT the whole run
        "cheat-echo": (
            CHEATS_02,
            {f"2.{i}" for i in range(1, 9)},
            {
                "2.2": ("after the loop ended",),  # a find-and-fix cell: one check failed earns nothing
                "2.3": 0,
                "2.4": 0,
                "2.5": 0,
                "2.6": 0,
                "2.8": 0,
            },
        ),
        "cheat-steps": (  # the layer's project_q / project_kv: refused; 2.2 and 2.5 handed in as shipped, unfixed
            lambda: CHEAT_02_STEPS + _shipped("generation", "generate") + _shipped("generation", "rms_norm"),
            {"2.1", "2.2", "2.4", "2.5"},
            {
                "2.4": 0,
                "2.5": ("root-mean-squares should be", "the largest values vanished"),
                "2.2": ("all 7 new tokens are the same", "should continue with 巴黎", "seeded alike"),
            },
        ),
        "other-ways": (
            lambda: _alternatives(
                "generation",
                {
                    "2.2": ("test_generation", "generate_token_list"),
                    "2.4": ("test_generation", "attention_per_head"),
                    "2.5": ("test_generation", "rms_norm_divide"),
                    "2.8": ("test_generation", "params_from_shapes"),
                },
            ),
            {f"2.{i}" for i in range(1, 9)},
            dict.fromkeys(("2.2", "2.4", "2.5", "2.8"), "full"),
        ),
    },
    "fused": {
        "cheat-modes-off": (
            CHEAT_09_MODES_OFF,
            {"9.1", "9.2"},
            {"9.1": {"online_softmax_reads_one_chunk_at_a_time": "kept the chunks it read"}, "9.2": 0},
        ),
        "cheat-frames": (
            CHEAT_09_FRAMES,
            {"9.1", "9.2"},
            {"9.1": 0, "9.2": 0, "9.4": 0, "9.5": 0},
        ),
        "cheat-threads": (
            CHEAT_09_THREADS,
            {"9.1", "9.2"},
            {"9.1": {"online_softmax_reads_one_chunk_at_a_time": "kept the chunks it read"}, "9.2": 0},
        ),
        "other-ways": (
            lambda: _alternatives(
                "fused",
                {
                    "9.1": ("test_fused", "online_lse"),
                    "9.2": ("test_fused", "tiled_query_rows"),
                    "9.3": ("test_fused", "merge_pairwise"),
                    "9.4": ("test_fused", "folded_einsum"),
                    "9.5": ("test_fused", "splits_fill_waves"),
                },
            ),
            {"9.1", "9.2", "9.3", "9.4", "9.5"},
            dict.fromkeys(("9.1", "9.2", "9.3", "9.4", "9.5"), "full"),
        ),
    },
    "speculative": {
        "cheat-frames": (
            lambda: CHEAT_10_FRAMES + __import__("test_trusted_measures").HIDDEN_PASSES,
            {"10.1", "10.2", "10.3"},
            {"10.1": "full", "10.2": 0, "10.3": 0, "10.5": 0},
        ),
        "verify-past-a-mismatch": (VERIFY_PAST_A_MISMATCH_10, {"10.2", "10.3"}, {"10.1": 0, "10.3": "full"}),
        "other-ways": (
            lambda: _alternatives(
                "speculative",
                {
                    "10.1": ("test_speculative", "verify_cumprod"),
                    "10.2": ("test_speculative", "generate_prefill_all_but_last"),
                    "10.3": ("test_speculative", "accept_uniforms_first"),
                    "10.4": ("test_speculative", "lookup_reversed"),
                    "10.5": ("test_speculative", "pass_by_outcomes"),
                },
            ),
            {"10.1", "10.2", "10.3", "10.4", "10.5"},
            dict.fromkeys(("10.1", "10.2", "10.3", "10.4", "10.5"), "full"),
        ),
    },
    "gqa": {
        "shortcut-sdpa": (
            SHORTCUT_06,
            {"6.1", "6.2"},
            {"6.1": "full", "6.2": {"grouped_attention_does_not_copy_heads": "scaled_dot_product_attention"}},
        ),
        "hard-coded": (  # and 6.2's decode steps through kvlib's split-K attention: refused, the checks of them lost
            HARD_CODED_06,
            {"6.1", "6.2", "6.3", "6.4", "6.5"},
            {
                "6.2": {"grouped_attention_boundaries": "split-K", "grouped_attention_does_not_copy_heads": "split-K"},
                "6.4": "full",
                "6.5": 0,
            },
        ),
    },
    "roofline": {  # a prediction (issue 46) copied as the number the notebook shows, 5.4 through the notebooks' roofline
        # time: no point for them; 5.2's search to a cap loses the check whose ridge sits just under the limit; 5.3
        # handed in as shipped (a find-and-fix, its bug unfixed): 0
        "hard-coded": (
            lambda: HARD_CODED_05 + _shipped("roofline", "step_cost"),
            {"5.1", "5.2", "5.3", "5.4", "5.5"},
            {"5.2": {"ridge_batch_just_under_the_limit": "gave up too soon"}, "5.3": 0, "5.4": 0, "5.5": 0},
        ),
    },
    "serving": {  # a copy-on-write that copies nothing scores 0 on 7.5; another policy in the budget, full on 7.7
        # (7.3's yardstick is with the checks, which the child cannot import: tests/grading/test_attacks.py)
        "cow-nothing-policy-other": (
            SERVING_07,
            {"7.1", "7.2", "7.3", "7.4", "7.6", "7.7"},
            {"7.3": "full", "7.4": "full", "7.5": 0, "7.7": "full"},
        ),
    },
    "kv_cache": {  # 4.3 through the model's own call, 4.2 and 4.4 by kvlib's code: each closed while checked, 0
        "shortcut-model": (SHORTCUT_04, {"4.1", "4.2", "4.3", "4.4"}, {"4.2": 0, "4.3": 0, "4.4": 0}),
        # 4.3 left as shipped (a find-and-fix), every other exercise done: 0 on 4.3, and on 4.5 that runs it
        "shipped-4.3": (_shipped_04, {"4.1", "4.2", "4.4", "4.5", "4.6"}, {"4.2": "full", "4.3": 0, "4.5": 0}),
    },
    "recompute": {  # 3.1 and 3.4 measured on a model built for the config: 0, and 3.2 and 3.3, which call 3.1
        "shortcut-model": (SHORTCUT_03, {"3.1", "3.2", "3.3", "3.4"}, dict.fromkeys(("3.1", "3.2", "3.3", "3.4"), 0)),
    },
}


def _reference_with(module: str, keep: set, appended: str) -> str:
    """kvlib/<module>.py: the reference's exercises in `keep`, the others stubs, then `appended` (which redefines)."""
    out, current, skipping = [], None, False
    for line in (ROOT / "solutions" / "kvlib" / f"{module}.py").read_text(encoding="utf-8").splitlines(keepends=True):
        found = re.match(r'\s*@exercise\("(\d+\.\d+)"', line)
        current = found.group(1) if found else current
        if line.strip() == "### BEGIN SOLUTION":
            if current not in keep:
                indent = line[: len(line) - len(line.lstrip())]
                out.append(f'{indent}raise NotImplementedError("Exercise {current}: not handed in")\n')
                skipping = True
        elif line.strip() == "### END SOLUTION":
            skipping = False
        elif not skipping:
            out.append(line)
    return "".join(out) + appended


# (notebook, module) from 02 on, graded in the isolated child: every notebook of the exercise table but 01
# (tests/grading/test_attacks.py) and any left in NOT_PROXYABLE
ISOLATED = [(nb, m) for nb, m in dict((ex.notebook, ex.module) for ex in EXERCISES).items() if m in PROXYABLE_MODULES][
    1:
]


@pytest.fixture(scope="module")
def graded_sizes(request, tmp_path_factory):
    """grade(notebook) -> {student: (score, max_score)}: every notebook this run's tests ask for (so `-k 07` grades
    07 only), released from one `kvlib course init` folder, a correct, a patching and an untouched submission (and
    in 04 a helper one) handed in for each, all graded in ONE `nbgrader autograde "*"`: nbgrader, the checks and
    torch load once, not once a notebook (this file is one scheduling unit, tests/conftest.py)."""
    from nbgrader.api import Gradebook

    wanted = sorted(
        {
            item.callspec.params["nb"]
            for item in request.session.items
            if item.path == request.path and "nb" in getattr(getattr(item, "callspec", None), "params", {})
        }
    )
    course = tmp_path_factory.mktemp("course-sizes")
    proc = run_kvlib("course", "init", str(course))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(course / "nbgrader_config.py", "a") as f:  # the kernel's run is cut short: scores never wait on it
        f.write("\nc.Execute.timeout = 4\nc.SandboxExecute.notebook_timeout = 12\n")
    nbgrader(course, "generate_assignment", "*", "--log-level=WARN")  # every assignment, in one process
    for nb in wanted:
        module = dict(ISOLATED)[nb]
        students = [
            ("correct", (ROOT / "solutions" / "kvlib" / f"{module}.py").read_text(encoding="utf-8")),
            ("patching", _stub_with(module, PATCHING_PRELUDE, "return 0")),
            ("untouched", None),
        ]  # the release handed in as it is
        helper = None
        if module == "kv_cache":  # issue 15's learner: 4.2's code in kvlib/my_helpers.py, imported by kv_cache.py
            text, helper = _with_helper_module("kv_cache", "4.2", "attention_with_cache")
            students.append(("helper", text))
        for student, (appended, keep, _) in BANK.get(module, {}).items():
            students.append((student, _reference_with(module, keep, appended() if callable(appended) else appended)))
        for student, text in students:
            sub = course / "submitted" / student / nb
            shutil.copytree(course / "release" / nb, sub)
            if text is None:
                continue
            (sub / "kvlib" / f"{module}.py").write_text(text, encoding="utf-8")
            if student == "helper":
                (sub / "kvlib" / "my_helpers.py").write_text(helper, encoding="utf-8")
            for earlier in EARLIER_DONE.get(module, ()):
                shutil.copy(ROOT / "solutions" / "kvlib" / f"{earlier}.py", sub / "kvlib" / f"{earlier}.py")
    if wanted:
        nbgrader(course, "autograde", "*", "--log-level=WARN", timeout=3000)  # every handed-in notebook at once
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        done = {nb: {s.student.id: (s.score, s.max_score) for s in gb.assignment_submissions(nb)} for nb in wanted}
        cells = {
            (nb, s.student.id): _cells(course, gb, nb, s.student.id)
            for nb in wanted
            for s in gb.assignment_submissions(nb)
            if s.student.id in BANK.get(dict(ISOLATED)[nb], {})
        }

    def grade(nb: str) -> dict:
        return done[nb]

    grade.cells = lambda nb, student: cells[nb, student]
    return grade


def _cells(course, gb, nb: str, student: str) -> dict:
    """exercise -> (score, max_score, {check: message} of the checks that failed, or None where all did or the cell is
    whole (a find-and-fix exercise's), the error's text or "") of each graded cell of the student's notebook, read from
    the gradebook and the autograded notebook's outputs."""
    import nbformat

    out = {}
    for path in sorted((course / "autograded" / student / nb).glob("*.ipynb")):
        notebook = gb.find_submission_notebook(path.stem, nb, student)
        scores = {g.name: (g.score, g.max_score) for g in notebook.grades}
        for cell in nbformat.read(path, as_version=4).cells:
            gid = cell.metadata.get("nbgrader", {}).get("grade_id", "")
            if gid not in scores or not gid.startswith("checks-"):
                continue
            text = "".join(o.get("text", "") for o in cell.get("outputs", []))
            failed = dict(re.findall(r"^failed: (\w+): (.*)$", text, re.M))
            error = "\n".join(o.get("evalue", "") for o in cell.get("outputs", []) if o.get("output_type") == "error")
            if error:
                failed = None  # every check of the cell failed, or the cell is whole and one did
            out[gid[len("checks-") :].replace("-", ".")] = (*scores[gid], failed, error)
    return out


@pytest.mark.parametrize("nb", [nb for nb, module in ISOLATED if module in BANK])
def test_cheats_and_shortcuts_earn_nothing_and_other_right_ways_everything(graded_sizes, nb):
    """Check, through nbgrader and the isolated child, each submission of BANK: a cheat (work hidden from torch's
    dispatch modes, a caller's frame read, numpy or a thread, torch's fused attention brought back, a design or a
    prediction copied from the notebook's output: 9.5, 10.5) scores 0 on the cell it targets, or fails the one
    check it targets, naming the cause, as the same code written without the cheat would; a library shortcut loses
    the check that the shortcut skips; right code written other ways scores full."""
    module = dict(ISOLATED)[nb]
    for student, (_, _, want) in BANK[module].items():
        cells = graded_sizes.cells(nb, student)
        for ex, expect in want.items():
            score, max_score, failed, error = cells[ex]
            where = f"{student}, Exercise {ex}: {score} of {max_score}, failed {failed}, error {error[:600]!r}"
            if expect == "full":
                assert score == max_score and not failed, where
            elif expect == 0:
                assert score == 0, where
            elif isinstance(expect, tuple):  # a find-and-fix cell: 0, its error showing each symptom
                assert score == 0 and all(words in error for words in expect), where
            else:
                assert 0 < score < max_score and failed is not None and set(failed) == set(expect), where
                assert all(words in failed[name] for name, words in expect.items()), where


@pytest.mark.parametrize("nb", [nb for nb, _ in ISOLATED])
def test_scores_come_from_the_isolated_child(graded_sizes, nb):
    """Check that the scores of notebooks 02 to 10 come from the isolated child: correct -> full marks, the
    untouched release -> 0, and a submission that patches the checks and grade() in its kernel -> 0
    (notebook 01: tests/grading/test_attacks.py)."""
    scores = graded_sizes(nb)
    correct, max_score = scores["correct"]
    assert max_score > 0 and correct == max_score
    assert max_score == points(nb)[1], (
        f"{nb}'s maximum is not the points of every part's graded cells (02, 04, 08: two)"
    )
    assert scores["untouched"][0] == 0
    assert scores["patching"][0] == 0
    if "helper" in scores:  # code moved into the learner's own kvlib/my_helpers.py: full marks too
        assert scores["helper"] == (max_score, max_score)
