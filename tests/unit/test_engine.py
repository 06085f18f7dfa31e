"""Engine behaviour on tiny random models: exactness against HF, batching invariance, limits, cancellation."""

import pytest
import torch

from specgram.errors import InvalidRequest
from specgram.request import SamplingParams

from .helpers import pinned_eos, reference_model, run_to_end, text_of, tokens_of

PROMPTS = ["Hello there", "The quick brown fox jumps", "a", "Speculative decoding with grammars: ünïcödé ✓ 🚀"]


def hf_greedy(model, prompt_ids, max_new):
    out = model.generate(
        torch.tensor([prompt_ids]),
        attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
        max_new_tokens=max_new,
        do_sample=False,
        eos_token_id=2,
        pad_token_id=0,
    )
    return out[0, len(prompt_ids) :].tolist()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_equals_hf_generate(make_engine, prompt):
    engine = make_engine()
    req = engine.make_request(SamplingParams(max_tokens=40), text=prompt)
    got = tokens_of(run_to_end(engine, [req])[req.request_id])
    assert got == hf_greedy(reference_model(engine), req.prompt_ids, 40)
    assert len(got) >= 1


@pytest.mark.parametrize("model_type", ["qwen2", "mistral"])
def test_other_llama_family_types_equal_hf(tmp_path, model_type):
    from specgram.config import EngineConfig
    from specgram.engine.engine import Engine

    from .tiny import save_checkpoint

    ckpt = save_checkpoint(tmp_path / model_type, model_type=model_type, seed=3)
    engine = Engine.from_config(EngineConfig(checkpoint=str(ckpt), max_slots=2, max_seq_len=128))
    req = engine.make_request(SamplingParams(max_tokens=24), text="Qwen and Mistral")
    assert tokens_of(run_to_end(engine, [req])[req.request_id]) == hf_greedy(
        reference_model(engine), req.prompt_ids, 24
    )


def test_concurrent_requests_equal_alone(make_engine):
    """More requests than slots, mixed prompt lengths and max_tokens: each output equals its solo run."""
    engine = make_engine(max_slots=3)
    specs = [(p, m) for p, m in zip(PROMPTS * 2, [5, 17, 30, 9, 23, 1, 12, 40], strict=True)]
    alone = []
    for p, m in specs:
        r = engine.make_request(SamplingParams(max_tokens=m), text=p)
        alone.append(tokens_of(run_to_end(engine, [r])[r.request_id]))
    reqs = [engine.make_request(SamplingParams(max_tokens=m), text=p) for p, m in specs]
    together = run_to_end(engine, reqs)
    assert [tokens_of(together[r.request_id]) for r in reqs] == alone
    assert engine.scheduler.free_slots and len(engine.scheduler.free_slots) == 3 and not engine.scheduler.running


def test_requests_join_while_others_run(make_engine):
    engine = make_engine(max_slots=4)
    first = engine.make_request(SamplingParams(max_tokens=30), text=PROMPTS[1])
    solo = tokens_of(run_to_end(engine, [first])[first.request_id])
    a = engine.make_request(SamplingParams(max_tokens=30), text=PROMPTS[1])
    engine.add(a)
    outs = {a.request_id: []}
    late = []
    for i in range(40):
        if i in (3, 7):
            r = engine.make_request(SamplingParams(max_tokens=10), text=PROMPTS[0])
            engine.add(r)
            outs[r.request_id] = []
            late.append(r)
        if i == 4:
            assert len(engine.scheduler.running) == 2, "a request admitted between steps joins the running batch"
        for o in engine.step():
            outs[o.request_id].append(o)
    assert tokens_of(outs[a.request_id]) == solo
    assert tokens_of(outs[late[0].request_id]) == tokens_of(outs[late[1].request_id])


def test_seeded_sampling_is_reproducible_and_batch_independent(make_engine):
    engine = make_engine()
    params = dict(max_tokens=30, temperature=1.0, top_p=0.95, top_k=50)

    def run(seed, company=0):
        reqs = [engine.make_request(SamplingParams(seed=seed, **params), text=PROMPTS[0])]
        reqs += [engine.make_request(SamplingParams(seed=100 + i, **params), text=PROMPTS[1]) for i in range(company)]
        return tokens_of(run_to_end(engine, reqs)[reqs[0].request_id])

    a, b, c = run(7), run(7), run(7, company=3)
    assert a == b == c
    assert run(8) != a


def test_top_k_1_is_greedy(make_engine):
    engine = make_engine()
    g = engine.make_request(SamplingParams(max_tokens=20), text=PROMPTS[3])
    s = engine.make_request(SamplingParams(max_tokens=20, temperature=0.7, top_k=1, seed=1), text=PROMPTS[3])
    outs = run_to_end(engine, [g, s])
    assert tokens_of(outs[g.request_id]) == tokens_of(outs[s.request_id])


def test_stream_pieces_join_to_full_decode(make_engine):
    engine = make_engine()
    req = engine.make_request(SamplingParams(max_tokens=60, ignore_eos=True, temperature=1.0, seed=3), text=PROMPTS[3])
    outs = run_to_end(engine, [req])[req.request_id]
    ids = tokens_of(outs)
    assert len(ids) == 60 and outs[-1].finish_reason == "length"
    assert text_of(outs) == engine.tokenizer.decode(ids, skip_special_tokens=True)
    assert sum(1 for o in outs if o.finished) == 1 and outs[-1].finished


def test_stop_string_cuts_output_and_is_never_streamed(make_engine):
    engine = make_engine()
    base = engine.make_request(SamplingParams(max_tokens=40, ignore_eos=True), text=PROMPTS[1])
    full = text_of(run_to_end(engine, [base])[base.request_id])
    stop = full[10:14]
    assert len(stop) == 4
    req = engine.make_request(SamplingParams(max_tokens=40, ignore_eos=True, stop=[stop, "\x00never"]), text=PROMPTS[1])
    outs = run_to_end(engine, [req])[req.request_id]
    cut = full.index(stop)
    assert text_of(outs) == full[:cut]
    assert outs[-1].finish_reason == "stop"
    streamed = ""
    for o in outs:  # at no point did the stream run ahead of the final text
        streamed += o.text
        assert full[:cut].startswith(streamed)


def test_eos_finishes_with_stop(make_engine):
    """The EOS id is pinned to a token this random model emits mid-output: generation stops right there."""
    engine = make_engine()
    base = engine.make_request(SamplingParams(max_tokens=30, ignore_eos=True), text=PROMPTS[1])
    full = tokens_of(run_to_end(engine, [base])[base.request_id])
    eos = full[10]
    cut = full.index(eos) + 1
    with pinned_eos(engine, eos):
        req = engine.make_request(SamplingParams(max_tokens=30), text=PROMPTS[1])
        outs = run_to_end(engine, [req])[req.request_id]
    assert tokens_of(outs) == full[:cut] and cut <= 11
    assert outs[-1].finished and outs[-1].finish_reason == "stop"
    assert text_of(outs) == engine.tokenizer.decode(full[: cut - 1], skip_special_tokens=True)  # EOS is not text


def test_context_limit_finishes_with_length(make_engine):
    engine = make_engine(max_seq_len=64)
    prompt_ids = list(range(3, 3 + 60))
    req = engine.make_request(SamplingParams(max_tokens=50, ignore_eos=True), prompt_ids=prompt_ids)
    outs = run_to_end(engine, [req])[req.request_id]
    assert len(tokens_of(outs)) == 4 and outs[-1].finish_reason == "length"
    with pytest.raises(InvalidRequest, match="at most 63"):
        engine.make_request(SamplingParams(), prompt_ids=list(range(3, 3 + 64)))


def test_abort_frees_slot_and_leaves_others_unchanged(make_engine):
    engine = make_engine(max_slots=2)
    keep = engine.make_request(SamplingParams(max_tokens=25), text=PROMPTS[0])
    solo = tokens_of(run_to_end(engine, [keep])[keep.request_id])
    keep = engine.make_request(SamplingParams(max_tokens=25), text=PROMPTS[0])
    victim = engine.make_request(SamplingParams(max_tokens=25), text=PROMPTS[1])
    waiting = engine.make_request(SamplingParams(max_tokens=25), text=PROMPTS[1])
    for r in (keep, victim, waiting):
        engine.add(r)
    outs = {r.request_id: [] for r in (keep, victim, waiting)}
    for _ in range(3):
        for o in engine.step():
            outs[o.request_id].append(o)
    assert waiting in engine.scheduler.waiting and not engine.scheduler.free_slots
    final = engine.abort(victim.request_id)
    assert final.finished and final.finish_reason == "cancelled"
    assert engine.scheduler.free_slots == [victim.slot]
    outs[victim.request_id].append(final)
    for o in engine.step():  # the freed slot is taken by the waiting request within one step
        outs[o.request_id].append(o)
    assert waiting.request_id in engine.scheduler.running
    assert engine.abort(victim.request_id) is None
    while engine.has_work():
        for o in engine.step():
            outs[o.request_id].append(o)
    assert tokens_of(outs[keep.request_id]) == solo
    assert sum(o.finished for o in outs[victim.request_id]) == 1


@pytest.mark.parametrize(
    "params, message",
    [
        (dict(max_tokens=0), "max_tokens"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_k=-5), "top_k"),
        (dict(seed=-(2**63) - 1), "seed"),
        (dict(stop=[""]), "stop"),
        (dict(num_draft_tokens=99), "num_draft_tokens"),
        (dict(guide="{}"), "guided_decoding_guide_type"),
        (dict(guide_type="yaml", guide="x"), "unknown guided_decoding_guide_type"),
        (dict(guide_type="regex", guide=""), "empty"),
        (dict(guide_type="json_schema", guide="{not json"), "not valid JSON"),
    ],
)
def test_invalid_params_raise_for_that_request(make_engine, params, message):
    engine = make_engine()
    with pytest.raises(InvalidRequest, match=message):
        engine.make_request(SamplingParams(**params), text="hi")


def test_unsupported_features_are_refused_not_ignored(make_engine):
    engine = make_engine()
    with pytest.raises(InvalidRequest, match="drafter 'draft_model'"):  # no draft model configured here
        engine.make_request(SamplingParams(num_draft_tokens=2, drafter="draft_model"), text="hi")


def test_empty_prompt_and_chat_template(make_engine):
    engine = make_engine()
    with pytest.raises(InvalidRequest, match="empty"):
        engine.make_request(SamplingParams(), text="")
    req = engine.make_request(SamplingParams(max_tokens=3), text="hi", chat=True)
    assert engine.tokenizer.decode(req.prompt_ids) == "<s>user: hi\n<s>assistant: "


def test_forward_failure_fails_only_that_forward(make_engine, monkeypatch, caplog):
    engine = make_engine()
    req = engine.make_request(SamplingParams(max_tokens=5), text="hi")
    monkeypatch.setattr(engine.target, "forward_rows", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    outs = run_to_end(engine, [req])[req.request_id]
    assert len(outs) == 1 and outs[0].finish_reason == "error" and "boom" in outs[0].error
    assert outs[0].error_kind == "internal"
    # the server log keeps the failure with its traceback, naming the request
    [record] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert str(req.request_id) in record.getMessage() and record.exc_info[1].args == ("boom",)
    assert not engine.scheduler.running and len(engine.scheduler.free_slots) == 4


@pytest.mark.parametrize("broken", ["mask_verify", "draft", "forward_split"])
def test_a_failure_in_a_shared_prefill_and_verify_step_fails_only_its_side(make_engine, monkeypatch, broken):
    """A step whose prompt chunk and verify rows share one forward: a failure of the decode side (accepting,
    drafting) fails only the decoding request, and the prompt that completes in that step still gets its
    token and its final response; a failure of the shared forward fails both."""
    engine = make_engine(device="cpu", linear="native")
    running = engine.make_request(SamplingParams(max_tokens=30, ignore_eos=True), text="hi")
    engine.add(running)
    engine.step()  # "hi" is prefilled: it now decodes
    new = engine.make_request(SamplingParams(max_tokens=1), text=PROMPTS[1])
    engine.add(new)
    owner = {"mask_verify": engine.logits, "draft": engine.planner, "forward_split": engine.target.native}[broken]
    monkeypatch.setattr(owner, broken, lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    outs = {o.request_id: o for o in engine.step()}
    assert outs[running.request_id].finish_reason == "error" and "boom" in outs[running.request_id].error
    if broken == "forward_split":
        assert outs[new.request_id].finish_reason == "error"
    else:
        assert outs[new.request_id].finish_reason == "length" and len(outs[new.request_id].token_ids) == 1
    assert not engine.scheduler.running and len(engine.scheduler.free_slots) == 4


def test_a_failure_while_committing_one_request_fails_that_request_alone(make_engine, monkeypatch):
    """Two requests commit in the same step; committing the second raises: the first's final response still
    goes out (it left the scheduler when it finished), the second gets an error, the slots are free."""
    engine = make_engine()
    done = engine.make_request(SamplingParams(max_tokens=1), text="hi")
    broken = engine.make_request(SamplingParams(max_tokens=5), text=PROMPTS[1])
    commit = engine.output.commit

    def failing(req, tokens, logprobs=None):
        if req is broken:
            raise RuntimeError("boom")
        return commit(req, tokens, logprobs)

    monkeypatch.setattr(engine.output, "commit", failing)
    engine.add(done)
    engine.add(broken)
    outs = {o.request_id: o for o in engine.step()}
    assert outs[done.request_id].finish_reason == "length" and len(outs[done.request_id].token_ids) == 1
    assert outs[broken.request_id].finish_reason == "error" and "boom" in outs[broken.request_id].error
    assert not engine.scheduler.running and len(engine.scheduler.free_slots) == 4


LONG = "A long prompt that is prefilled in several chunks, while other requests keep decoding. " * 2


@pytest.mark.parametrize("linear", ["native", "torch"])
def test_chunked_prefill_equals_whole_prompt_prefill(make_engine, linear):
    whole = make_engine(max_prefill_tokens=4096, linear=linear)
    chunked = make_engine(max_prefill_tokens=7, linear=linear)
    outs = []
    for engine in (whole, chunked):
        reqs = [engine.make_request(SamplingParams(max_tokens=12), text=p) for p in (LONG, *PROMPTS)]
        got = run_to_end(engine, reqs)
        outs.append([tokens_of(got[r.request_id]) for r in reqs])
    assert outs[0] == outs[1]


def test_a_prefill_step_ends_at_a_prompt_end_once_it_holds_pack_tokens(make_engine):
    from specgram.engine.scheduler import Scheduler

    engine = make_engine()

    def chunk_sizes(sched, lengths):
        reqs = [engine.make_request(SamplingParams(max_tokens=2), prompt_ids=list(range(3, 3 + n))) for n in lengths]
        for r in reqs:
            sched.add(r)
        sched.admit()
        steps = []
        while chunks := sched.prefill_chunks():
            steps.append([(reqs.index(r), n) for r, n in chunks])
            for r, n in chunks:
                r.cache_len += n
        return steps

    assert chunk_sizes(Scheduler(4, 50, pack_tokens=20), [8, 15, 40, 30]) == [
        [(0, 8), (1, 15)],
        [(2, 40)],
        [(3, 30)],
    ]  # 8 < 20 takes the next prompt; 23 >= 20 ends the step
    assert chunk_sizes(Scheduler(4, 50), [8, 15, 40, 30]) == [  # packed to the budget
        [(0, 8), (1, 15), (2, 27)],
        [(2, 13), (3, 30)],
    ]
    assert chunk_sizes(Scheduler(4, 16, pack_tokens=64), [40, 5]) == [  # the budget still caps a step
        [(0, 16)],
        [(0, 16)],
        [(0, 8), (1, 5)],
    ]
    assert chunk_sizes(Scheduler(4, 50, pack_tokens=20), [20, 5]) == [[(0, 20)], [(1, 5)]]  # 20 >= 20: ends
    cpu = make_engine(device="cpu", linear="native")
    assert cpu.scheduler.pack_tokens == 64 and cpu.target.fuse_steps  # the CPU engine's defaults


def test_prompt_chunks_and_verify_rows_share_one_forward(make_engine, monkeypatch):
    """Native CPU forward: a step with prompt chunks and decoding requests runs one forward for both. Greedy
    outputs (plain, speculative, guided) equal those with a forward each, and each request's output alone."""
    specs = [
        (LONG, dict(max_tokens=14)),
        ("hi", dict(max_tokens=24, num_draft_tokens=3)),
        (PROMPTS[3], dict(max_tokens=18, guide_type="regex", guide=r"(ab|cd|[e-h]x){2,12}")),
        (LONG[:50], dict(max_tokens=20, num_draft_tokens=2)),
        (PROMPTS[1], dict(max_tokens=9)),
        (LONG, dict(max_tokens=16, num_draft_tokens=4)),
    ]

    def outputs(engine):
        reqs = [engine.make_request(SamplingParams(**kw), text=t) for t, kw in specs]
        got = run_to_end(engine, reqs)
        return [tokens_of(got[r.request_id]) for r in reqs]

    fused = make_engine(max_slots=3, max_prefill_tokens=7, device="cpu", linear="native")
    calls = []
    split = fused.target.native.forward_split
    monkeypatch.setattr(fused.target.native, "forward_split", lambda *a, **k: calls.append(1) or split(*a, **k))
    together = outputs(fused)
    assert len(calls) >= 10  # the long prompts' chunks rode with decode rows
    alone = []
    for t, kw in specs:
        r = fused.make_request(SamplingParams(**kw), text=t)
        alone.append(tokens_of(run_to_end(fused, [r])[r.request_id]))
    unfused = make_engine(max_slots=3, max_prefill_tokens=7, device="cpu", linear="native")
    unfused.target.fuse_steps = False
    monkeypatch.setattr(unfused.target.native, "forward_split", lambda *a, **k: pytest.fail("fused: fuse_steps off"))
    separate = outputs(unfused)
    assert together == separate == alone
    assert all(len(t) >= 2 for t in together)


def test_running_requests_decode_while_a_long_prompt_prefills(make_engine):
    engine = make_engine(max_prefill_tokens=8)
    short = engine.make_request(SamplingParams(max_tokens=30, ignore_eos=True), text="hi")
    engine.add(short)
    first = engine.step()  # "hi" fits one chunk: its first token comes at once
    assert [o.request_id for o in first] == [short.request_id]
    long = engine.make_request(SamplingParams(max_tokens=4), text=LONG)
    engine.add(long)
    chunks = -(-len(long.prompt_ids) // 8)
    for _ in range(chunks - 1):  # the long prompt is still being prefilled ...
        outs = engine.step()
        assert [o.request_id for o in outs] == [short.request_id]  # ... and the short one decodes each step
        assert long.prefilling
    outs = engine.step()  # last chunk: the long request's first token
    assert {o.request_id for o in outs} == {short.request_id, long.request_id} and not long.prefilling


def test_engine_loop_builds_the_engine_on_its_own_thread(make_engine):
    import threading

    from specgram.serving.loop import EngineLoop

    built_on = []

    def factory():
        built_on.append(threading.current_thread())
        return make_engine()

    loop = EngineLoop.build(factory)
    try:
        assert built_on == [loop._thread] and loop.engine is not None
        done = threading.Event()
        outs = []
        req = loop.engine.make_request(SamplingParams(max_tokens=3), text="hi")
        loop.submit(req, lambda o: (outs.append(o), o.finished and done.set()))
        assert done.wait(30) and outs[-1].finished
    finally:
        loop.shutdown()
    with pytest.raises(RuntimeError, match="no checkpoint"):
        EngineLoop.build(lambda: (_ for _ in ()).throw(RuntimeError("no checkpoint")))
