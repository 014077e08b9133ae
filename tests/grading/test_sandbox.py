"""kvlib/grading/sandbox.py and its child (_child.py): replies are plain numbers, a returned Decoder is
rebuilt by the grader, and objects the notebooks pass (caches, generators, callbacks, schedulers)
live in the isolated child, with in-place changes copied back."""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest
from conftest import ROOT


def _npz(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def test_replies_must_be_plain_numbers():
    """Check that the grader's reader refuses pickles, compressed members and headers that lie."""
    from kvlib.grading.sandbox import SandboxError, load_reply

    head = np.array(json.dumps({"status": "ok"}))
    assert load_reply(_npz(__head__=head, a0=np.ones(3)))[1]["a0"].sum() == 3
    with pytest.raises(SandboxError):
        load_reply(_npz(__head__=head, a0=np.array([object()], dtype=object)))
    buf = io.BytesIO()
    np.savez_compressed(buf, __head__=head, a0=np.zeros(10))
    with pytest.raises(SandboxError):
        load_reply(buf.getvalue())
    liar = io.BytesIO()
    with zipfile.ZipFile(liar, "w") as z:
        z.writestr("__head__.npy", _npy(head))
        z.writestr("a0.npy", _npy_header((10**9,), "<f8") + b"\0" * 16)
    with pytest.raises(SandboxError):
        load_reply(liar.getvalue())


def test_a_returned_decoder_is_rebuilt_by_the_grader():
    """Check that a Decoder in a reply is rebuilt by the grader's own kvlib.core.model from numbers, refused
    when its weights do not match its config or its config is not numbers, and never accepted as a function."""
    import torch

    from kvlib.core.model import Decoder, ModelConfig
    from kvlib.grading import _child
    from kvlib.grading.sandbox import SandboxError, _check_node

    config = ModelConfig(vocab_size=11, d_model=16, n_layers=1, n_heads=4, n_kv_heads=2, hidden_dim=24, max_seq_len=8)
    torch.manual_seed(0)
    sent = Decoder(config).eval()
    enc = _child.Encoder(np, torch)
    node = enc.encode(sent)
    files = {k: np.asarray(v) for k, v in enc.arrays.items()}
    got = _check_node(node, files)
    assert type(got) is Decoder and got.config == config
    ids = torch.tensor([[1, 2, 3]])
    with torch.inference_mode():
        assert torch.equal(got(ids), sent(ids))
    wrong = {**node, "config": {**node["config"], "n_kv_heads": 4}}  # k_proj would need 4 heads of rows
    with pytest.raises(SandboxError, match="do not match"):
        _check_node(wrong, files)
    with pytest.raises(SandboxError, match="not numbers"):
        _check_node({**node, "config": {**node["config"], "d_model": "16"}}, files)
    with pytest.raises(SandboxError, match="too large"):
        _check_node({**node, "config": {**node["config"], "max_seq_len": 1 << 30}}, files)
    with pytest.raises(SandboxError):
        _check_node({"t": "fn", "v": "gqa.to_gqa"}, files)


def test_isolated_calls_copy_back_what_they_change_in_place(tmp_path):
    """Check that a learner's function that changes a tensor argument in place changes the grader's
    tensor too (as it would in the kernel), and that a function of the module passed as an argument runs only there."""
    import torch

    from kvlib.grading.sandbox import RemoteFunction, Sandbox, SandboxError, package_files

    files = package_files(ROOT / "kvlib")
    files["kvlib/gqa.py"] = (
        (ROOT / "solutions" / "kvlib" / "gqa.py")
        .read_text(encoding="utf-8")
        .replace("    B, H_kv, S, D = x.shape\n", "    B, H_kv, S, D = x.shape\n    x.mul_(2)\n", 1)
        .encode()
    )
    with Sandbox(
        files,
        ["gqa"],
        ["gqa.repeat_kv", "gqa.grouped_attention"],
        mode="plain",
        torch=True,
        call_timeout=60,
        budget=120,
    ) as sandbox:
        gqa = sandbox.module("gqa")
        x = torch.ones(1, 2, 3, 4)
        out = gqa.repeat_kv(x, 2)
        assert torch.equal(x, torch.full((1, 2, 3, 4), 2.0)) and out.shape == (1, 4, 3, 4)
        assert isinstance(gqa.first_head_of_group, RemoteFunction)
        with pytest.raises(SandboxError, match="only in the isolated child"):
            gqa.first_head_of_group(torch.randn(1, 2, 5, 4), 2, 1)


def test_the_child_keeps_a_learners_cache_and_carries_generators_and_callbacks():
    """Check that the objects notebooks 02 and 04 pass work through the child: a KVCache made and used
    there through a handle, a generator whose state comes back advanced, an on_token callback replayed here."""
    import torch

    from kvlib.core.model import Decoder, ModelConfig
    from kvlib.generation import next_token
    from kvlib.grading.sandbox import RemoteObject, Sandbox, SandboxError, package_files

    files = package_files(ROOT / "kvlib")
    for module in ("attention", "generation", "kv_cache"):  # 4.x use 1.3's mask and 2.1's sampling
        files[f"kvlib/{module}.py"] = (ROOT / "solutions" / "kvlib" / f"{module}.py").read_bytes()
    functions = ["generation.next_token", "kv_cache.KVCache", "kv_cache.generate_cached"]
    config = ModelConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=24, max_seq_len=32)
    with Sandbox(
        files, ["generation", "kv_cache"], functions, mode="plain", torch=True, call_timeout=60, budget=120
    ) as sandbox:
        kv, gen = sandbox.module("kv_cache"), sandbox.module("generation")
        cache = kv.KVCache(config, batch=1, max_seq_len=8)
        assert isinstance(cache, RemoteObject) and cache.pos == 0 and tuple(cache.k.shape) == (2, 1, 2, 8, 4)
        (k, _), usage = cache.update.memory(1, torch.ones(1, 2, 3, 4), torch.ones(1, 2, 3, 4))  # a method, measured
        cache.advance(3)
        assert tuple(k.shape) == (1, 2, 3, 4) and cache.pos == 3 and usage.inputs == 2 * 24 * 4
        cache.pos = 1  # assigned in the child, as in the kernel
        assert cache.pos == 1
        with pytest.raises(SandboxError, match="private attribute"):
            cache._pos = 0
        ours, theirs = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
        logits = torch.randn(6, 13)
        assert torch.equal(gen.next_token(logits, temperature=1.0, generator=theirs), next_token(logits, 1.0, ours))
        assert torch.equal(theirs.get_state(), ours.get_state())  # the child's draws advanced our generator
        torch.manual_seed(0)
        model, seen = Decoder(config).eval(), []
        out = kv.generate_cached(
            model, torch.tensor([[1, 2]]), 4, on_token=lambda t: seen.append(int(t[0])), cache=cache
        )
        assert seen == out[0, 2:].tolist() and cache.pos == 2 + 3  # the cache made before, reset and reused


def test_the_child_keeps_a_schedulers_pool_and_tables_and_carries_requests():
    """Check that the objects notebook 07 passes work through the child: a BlockPool, BlockTables and a
    Scheduler kept there, attributes assigned there (pool.k = ...), Requests and the stats dict carried as
    numbers, and an OutOfBlocks raised there raised here as kvlib.core.paging's own."""
    import torch

    from kvlib.core.model import Decoder, ModelConfig
    from kvlib.core.paging import OutOfBlocks, Request
    from kvlib.grading.sandbox import RemoteObject, Sandbox, package_files

    files = package_files(ROOT / "kvlib")
    for module in ("attention", "gqa", "serving"):  # 7.3 uses 6.2's grouped_attention
        files[f"kvlib/{module}.py"] = (ROOT / "solutions" / "kvlib" / f"{module}.py").read_bytes()
    functions = ["serving.BlockPool", "serving.BlockTable", "serving.Scheduler", "serving.paged_attention"]
    config = ModelConfig(vocab_size=13, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=24, max_seq_len=32)
    with Sandbox(files, ["serving"], functions, mode="plain", torch=True, call_timeout=60, budget=120) as sandbox:
        sv = sandbox.module("serving")
        assert sv.Request is Request and sv.OutOfBlocks is OutOfBlocks
        pool, table = sv.BlockPool(config, 4, 4), sv.BlockTable(4)
        assert isinstance(pool, RemoteObject) and isinstance(table, RemoteObject)
        pool.k = torch.ones(2, 4, 2, 4, 4)
        assert torch.equal(pool.k, torch.ones(2, 4, 2, 4, 4))
        assert table.append(pool, 5) == [0, 1, 2, 3, 4] and table.blocks == [0, 1] and pool.n_free == 2
        with pytest.raises(OutOfBlocks):
            table.append(pool, 12)  # 17 tokens: 5 blocks of a pool of 4
        torch.manual_seed(0)
        sched = sv.Scheduler(Decoder(config).eval(), sv.BlockPool(config, 8, 4), max_batch=2)
        sched.add(Request(7, [1, 2, 3], 2))
        waiting = sched.waiting
        assert [(r.id, r.prompt, r.max_new_tokens, r.out) for r in waiting] == [(7, [1, 2, 3], 2, [])]
        sched.step()
        assert sched.stats["decode_steps"] == 1 and [len(r.out) for r in sched.finished] == [2]


def _npy(arr) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def _npy_header(shape, descr) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"shape": shape, "fortran_order": False, "descr": descr})
    return buf.getvalue()


CALLING_BACK = '''
import torch


class Box:
    def __init__(self, value):
        self.value = value

    def get(self):
        return self.value


def ask(model, cache, xs):
    """Use the grader's objects as a learner's code does: call them, read and assign attributes, call methods,
    catch the error one raises, hand one back, and hand the grader an object of its own (the model reads it)."""
    out = [model(x, cache=cache) for x in xs]
    cache.pos = 5
    try:
        cache.truncate(-1)
    except ValueError as err:
        caught = str(err)
    hidden = hasattr(model, "secret")
    return out, cache.pos, caught, hidden, model.echo(cache) == 1, model(Box(torch.ones(2)), cache=cache)


def draw(p, generator):
    p.mul_(0)  # changes its own copy only
    return int(torch.multinomial(torch.ones(3), 1, generator=generator))
'''


class _GradersModel:
    """A check's model as the grading process keeps it: every call counted here."""

    _kvlib_grader_side = True
    kvlib_public = ("echo",)

    def __init__(self):
        self.calls, self.secret = [], "the expected answer"

    def __call__(self, x, cache=None):
        self.calls.append(cache)
        if hasattr(x, "get"):  # an object the learner's code made: it stays in the child, asked from here
            return x.get() * 2
        return x + cache.pos

    def echo(self, cache):
        return 1 if isinstance(cache, _GradersCache) else 0


class _GradersCache:
    _kvlib_grader_side = True

    def __init__(self):
        self.pos = 0

    def truncate(self, pos):
        raise ValueError(f"truncate needs 0 <= pos, got {pos}")


def test_the_child_calls_back_into_the_graders_objects():
    """Check that objects of the checks' own classes stay in the grading process: the child gets stand-ins whose
    calls, attribute reads and assignments, and method calls run here (counted here), an error one raises reaches
    the learner's except, the object comes back as itself, attributes outside kvlib_public are not there, an
    object of the learner's made in the child is used from here while the child waits (nested), and a batch of
    calls (fn.many) runs in turn with one generator, its draws carried back, each call its own copy of a tensor."""
    import torch

    from kvlib.grading.sandbox import Sandbox, package_files

    files = package_files(ROOT / "kvlib")
    files["kvlib/attention.py"] = CALLING_BACK.encode()
    model, cache = _GradersModel(), _GradersCache()
    with Sandbox(
        files, ["attention"], ["attention.ask", "attention.draw"], mode="plain", torch=True, call_timeout=60
    ) as sandbox:
        out, pos, caught, hidden, echoed, doubled = sandbox.module("attention").ask(model, cache, [torch.ones(2), 3])
        assert torch.equal(out[0], torch.ones(2)) and out[1] == 3 and pos == 5 and cache.pos == 5
        assert caught == "truncate needs 0 <= pos, got -1" and hidden is False and echoed is True
        assert torch.equal(doubled, torch.full((2,), 2.0))
        assert len(model.calls) == 3 and all(c is cache for c in model.calls)
        assert sandbox.questions >= 7 and not sandbox._parents  # handed out for the one call only
        ours, theirs = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
        p = torch.ones(3)
        got = sandbox.module("attention").draw.many([((p, theirs), {}) for _ in range(50)])
        assert got == [int(torch.multinomial(torch.ones(3), 1, generator=ours)) for _ in range(50)]
        assert torch.equal(theirs.get_state(), ours.get_state()) and torch.equal(p, torch.ones(3))


MEASURED = '''

import os

_KEPT = []


def hold(mb):
    """Write mb MB of fresh memory and let it go before returning."""
    x = torch.ones(mb << 18)
    return float(x[-1])


def hold_hidden(mb):
    """The same, where torch's dispatch modes (the allocation watch, the FLOP counter) see nothing."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        return hold(mb)


def keep(mb):
    """Keep mb MB between calls."""
    _KEPT.append(torch.ones(mb << 18))


def total(x):
    return float(x.sum())


def spawn():
    """Try to start a process (to do work out of the measured process's sight)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    return pid


def attend(q, k, v, way):
    """Causal attention through one of torch's entry points, after trying to bring its fused kernel back."""
    import gc
    import threading

    import torch.nn.functional as F

    T, S = q.shape[2], k.shape[2]
    mask = torch.ones(T, S, dtype=torch.bool).tril(S - T)
    if way == "undo":  # every dispatcher registration Python can find, dropped; the kernel asked for by name
        for lib in [o for o in gc.get_objects() if type(o).__name__ in ("Library", "_DispatchModule")]:
            try:
                (lib._destroy if hasattr(lib, "_destroy") else lib.reset)()
            except Exception:
                pass
        kernel = torch.library.get_kernel("aten::_scaled_dot_product_flash_attention_for_cpu", "CPU")
        keys = torch._C._dispatch_keyset_full()
        return kernel.call_boxed(keys, q, k, v, 0.0, True)[0]
    if way == "flash":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=True)[0]
    if way == "aten":
        return torch.ops.aten.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if way == "module":
        layer = torch.nn.MultiheadAttention(q.shape[1] * q.shape[3], q.shape[1], batch_first=True).eval()
        x = q.transpose(1, 2).flatten(2)
        with torch.inference_mode():
            return layer(x, x, x, need_weights=False, attn_mask=~mask)[0]
    out = []
    thread = threading.Thread(target=lambda: out.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask)))
    thread.start()
    thread.join()
    return out[0]
'''


def _modes() -> list[str]:
    """plain, and the jail this machine grades in (as root, user namespaces too)."""
    from kvlib.grading.jail import detect_mode

    jail = detect_mode()
    return list(dict.fromkeys(["plain", jail, *(["userns"] if jail == "namespaces" else [])]))


@pytest.mark.parametrize("mode", _modes())
def test_the_grader_measures_a_calls_memory_in_the_childs_proc(mode):
    """Check that a measured call's memory is read by the grading process in the child's /proc, in every mode this
    machine grades in: memory written and freed during the call shows at its peak (hidden from torch's dispatch
    modes or not), the arguments it receives are counted as its inputs (read in place, once), memory kept between
    calls shows as held at the next call's start, the child cannot start a process, and torch's fused attention kernel
    is gone there for good: every way to torch's attention (a thread, torch.ops, the kernel by name, nn.MultiheadAttention,
    after dropping every dispatcher registration gc finds) holds the whole score matrix."""
    import torch

    from kvlib.grading.sandbox import Sandbox, package_files

    MB = 1 << 20
    files = package_files(ROOT / "kvlib")
    files["kvlib/gqa.py"] = ((ROOT / "solutions" / "kvlib" / "gqa.py").read_text(encoding="utf-8") + MEASURED).encode()
    functions = [f"gqa.{name}" for name in ("hold", "hold_hidden", "keep", "total", "spawn", "attend")]
    with Sandbox(files, ["gqa"], functions, mode=mode, torch=True, call_timeout=60, budget=120) as sandbox:
        gqa = sandbox.module("gqa")
        for fn in (gqa.hold, gqa.hold_hidden):
            value, usage = fn.memory(64)
            assert value == 1.0 and 60 * MB <= usage.beyond_inputs < 80 * MB, usage  # the kernel counts RSS in batches
        x = torch.ones(32 << 18)  # 32 MB
        value, usage = gqa.total.memory(x)
        assert value == x.numel() and usage.inputs == 32 * MB and usage.beyond_inputs < 4 * MB, usage
        before = usage.held
        gqa.keep(48)
        _, usage = gqa.total.memory(torch.ones(3))
        assert usage.held - before >= 44 * MB and usage.beyond_inputs < 4 * MB, usage
        assert sandbox.spawn == "closed"
        with pytest.raises(PermissionError):
            gqa.spawn()
        assert sandbox.fused == "closed"
        q, k, v = (torch.randn(1, 8, 1024, 16) for _ in range(3))  # every head's scores: 32 MB
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        for way in ("thread", "aten", "flash", "module", "undo"):  # the kernel holds < 4 MB here (without the jail)
            out, usage = gqa.attend.memory(q, k, v, way)
            assert usage.beyond_inputs >= 32 * MB, (way, usage)
            if way != "module":
                torch.testing.assert_close(out, want)
