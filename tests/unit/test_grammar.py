"""Grammar masking through the speculative step (tiny random models, byte-level tokenizer): outputs obey the
grammar, speculation stays exact under a grammar, forced tokens are drafted for free, sampling keeps the
masked distribution, and bad guides fail only their own request (slow ones: test_grammar_pool.py)."""

import json
import re

import pytest

from specgram.errors import InvalidRequest
from specgram.grammar.compile import GuideType, xgrammar_reason
from specgram.grammar.compiler import GrammarCompiler
from specgram.grammar.guide import Guide
from specgram.request import AUTO_DRAFT, SamplingParams

from .distributions import chi2_critical, chi2_stat, exact_joint
from .helpers import PROMPTS, reference_model, run, run_to_end, target_and_draft, text_of, tokens_of

REGEX = r'\{"name": "[a-z]{1,6}", "kind": "(cat|dog|bird)", "age": [1-9][0-9]?\}'
SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "tag": {"enum": ["x", "yz"]}},
        "required": ["ok", "tag"],
        "additionalProperties": False,
    }
)
EBNF = 'root ::= "(" item ("," item)* ")"\nitem ::= [0-9] | "x"'
GUIDES = [("regex", REGEX), ("json_schema", SCHEMA), ("ebnf", EBNF)]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return target_and_draft(tmp_path_factory.mktemp("grammar"), 256)


def matcher_accepts(engine, kind, guide, ids):
    """An independent check: a fresh xgrammar matcher accepts the ids one by one."""
    g = Guide(engine.grammar.compile(engine.grammar.check(kind, guide), guide))
    return all(g.matcher.accept_token(t) for t in ids)


@pytest.mark.parametrize("kind, guide", GUIDES)
def test_outputs_obey_the_grammar_and_finish_it(engine, kind, guide):
    outs = run(engine, PROMPTS, max_tokens=120, guide_type=kind, guide=guide)
    finished = 0
    for o in outs:
        ids, text = tokens_of(o), text_of(o)
        assert matcher_accepts(engine, kind, guide, ids)
        if o[-1].finish_reason == "stop":
            finished += 1
            assert ids[-1] in engine.eos_ids
            if kind == "regex":
                assert re.fullmatch(REGEX, text), text
            elif kind == "json_schema":
                value = json.loads(text)
                assert value["tag"] in ("x", "yz") and isinstance(value["ok"], bool) and set(value) == {"ok", "tag"}
            else:
                assert re.fullmatch(r"\(([0-9x])(,[0-9x])*\)", text), text
    assert finished >= 1, "no request completed its grammar within max_tokens"


def test_unconstrained_output_would_violate_the_grammar(engine):
    """The masks matter: the same prompts without a guide produce text the regex rejects."""
    outs = run(engine, PROMPTS, max_tokens=30)
    assert not any(matcher_accepts(engine, "regex", REGEX, tokens_of(o)) for o in outs)


@pytest.mark.parametrize("k", [*range(1, 9), AUTO_DRAFT])
def test_greedy_identical_with_speculation_under_a_grammar(engine, k):
    for kind, guide in GUIDES:
        base = run(engine, PROMPTS, max_tokens=60, guide_type=kind, guide=guide)
        for drafter in ("ngram", "draft_model", "grammar"):
            spec = run(
                engine, PROMPTS, max_tokens=60, guide_type=kind, guide=guide, num_draft_tokens=k, drafter=drafter
            )
            assert [tokens_of(o) for o in spec] == [tokens_of(o) for o in base], (kind, drafter)


def test_mixed_batch_of_guided_and_free_requests_and_drafters(engine):
    prompts = PROMPTS * 2
    kinds = ["regex", None, "json_schema", "ebnf", None, "regex", "json_schema", None]
    guides = {"regex": REGEX, "json_schema": SCHEMA, "ebnf": EBNF, None: None}
    params = dict(max_tokens=50, guide_type=kinds, guide=[guides[k] for k in kinds])
    base = run(engine, prompts, **params)
    spec = run(
        engine,
        prompts,
        **params,
        num_draft_tokens=[3, 0, 8, 1, 5, 2, 4, 6],
        drafter=["grammar", "ngram", "draft_model", "ngram", "draft_model", "draft_model", "grammar", "ngram"],
    )
    assert [tokens_of(o) for o in spec] == [tokens_of(o) for o in base]


def test_grammar_forced_tokens_are_drafted_for_free_and_always_accepted(engine):
    [base] = run(engine, PROMPTS[:1], max_tokens=80, guide_type="regex", guide=REGEX)
    [forced] = run(
        engine, PROMPTS[:1], max_tokens=80, guide_type="regex", guide=REGEX, num_draft_tokens=8, drafter="grammar"
    )
    assert tokens_of(forced) == tokens_of(base)
    s = forced[-1].spec
    assert s.drafted >= 8 and s.accepted == s.drafted  # a forced token is the only legal one
    assert len(forced) < len(base)  # several tokens per step


def test_grammar_end_finishes_even_with_ignore_eos(engine):
    [o] = run(engine, PROMPTS[:1], max_tokens=200, guide_type="regex", guide=r"(yes|no)", ignore_eos=True)
    assert o[-1].finish_reason == "stop" and text_of(o) in ("yes", "no")


def test_commit_of_an_illegal_token_is_a_bug_not_a_branch(engine):
    g = Guide(engine.grammar.compile("regex", "ab"))
    a = engine.tokenizer("a", add_special_tokens=False)["input_ids"][0]
    with pytest.raises(AssertionError, match="violates the grammar"):
        g.commit(a + 1)


@pytest.mark.parametrize(
    "kind, guide, needle",
    [
        ("regex", "a(b", "regex"),
        ("json_schema", '{"type": "nonsense"}', "nonsense"),
        ("ebnf", "root ::= undefined_rule", "ebnf"),
        ("structural_tag", '{"format": 3}', "structural_tag"),
    ],
)
def test_bad_guide_fails_only_its_request(engine, kind, guide, needle):
    good = engine.make_request(SamplingParams(max_tokens=20), text=PROMPTS[0])
    bad = engine.make_request(SamplingParams(max_tokens=20, guide_type=kind, guide=guide), text=PROMPTS[0])
    [alone] = run(engine, PROMPTS[:1], max_tokens=20)
    outs = run_to_end(engine, [bad, good])
    [err] = outs[bad.request_id]
    assert err.finished and err.finish_reason == "error" and err.error_kind == "invalid" and needle in err.error
    assert tokens_of(outs[good.request_id]) == tokens_of(alone)


def test_oversized_guide_is_refused_at_once(engine):
    with pytest.raises(InvalidRequest, match="larger than"):
        engine.make_request(
            SamplingParams(guide_type="regex", guide="a" * (engine.grammar.max_guide_bytes + 1)), text="hi"
        )


# ---- sampling under a grammar: distribution ---------------------------------------------------------------

CHOICE = "[abc]{3}"


@pytest.mark.parametrize("drafter, k", [("draft_model", 3), ("ngram", 2), (None, 0)])
def test_sampling_under_a_grammar_matches_masked_sampling(tmp_path_factory, drafter, k):
    eng = target_and_draft(tmp_path_factory.mktemp("gs"), 64, max_slots=64, target_seed=4, draft_seed=9, init=0.05)
    prompt = eng.tokenizer("abc cab bca: ", add_special_tokens=False)["input_ids"]
    allowed = [eng.tokenizer(c, add_special_tokens=False)["input_ids"][0] for c in "abc"]
    expected = exact_joint(reference_model(eng), prompt, 3, 1.0, allowed=allowed)
    n = 2000
    reqs = [
        eng.make_request(
            SamplingParams(
                max_tokens=4,
                temperature=1.0,
                seed=i,
                guide_type="regex",
                guide=CHOICE,
                num_draft_tokens=k,
                drafter=drafter,
            ),
            prompt_ids=prompt,
        )
        for i in range(n)
    ]
    outs = run_to_end(eng, reqs)
    samples = []
    for r in reqs:
        ids = tokens_of(outs[r.request_id])
        assert len(ids) == 4 and ids[3] in eng.eos_ids  # three letters, then the grammar's forced end
        samples.append(tuple(ids[:3]))
    if k:
        stats = [outs[r.request_id][-1].spec for r in reqs]
        assert 0 < sum(s.accepted for s in stats) < sum(s.drafted for s in stats)
    stat, df = chi2_stat(samples, expected)
    assert stat < chi2_critical(df), (stat, df)


def test_forced_strings_are_drafted_in_multi_character_tokens():
    """With a real BPE vocabulary the rest of a key name is one forced string but several positions with more
    than one legal token (a whole word, or its pieces): only the jump-forward string drafts it."""
    from pathlib import Path

    import torch

    from specgram.grammar.masks import StepMasks
    from specgram.model.source import open_source

    path = Path(__file__).resolve().parents[2] / "models" / "SmolLM2-135M-Instruct"
    if not path.is_dir():
        pytest.skip("the default model's tokenizer is fetched by scripts/setup.sh")
    tok = open_source(path).tokenizer()
    vocab = len(tok)
    compiler = GrammarCompiler(
        tok, vocab, [tok.eos_token_id], cache_bytes=1 << 24, timeout_s=30, json_strict=True, json_any_whitespace=False
    )
    schema = json.dumps(
        {
            "type": "object",
            "properties": {"customer_identifier": {"type": "integer"}},
            "required": ["customer_identifier"],
            "additionalProperties": False,
        }
    )
    masks = StepMasks(vocab, 1, 8, torch.device("cpu"))
    drafted = {}
    for strings in (False, True):
        guide = Guide(compiler.compile(GuideType.JSON_SCHEMA, schema))
        drafted[strings] = masks.forced_prefix(0, guide, 8, strings)
        assert guide.tentative == len(drafted[strings])  # every drafted token accepted tentatively
        guide.rollback()
    text = tok.decode(drafted[True])
    assert text.startswith('{"customer_identifier"') and len(drafted[True]) > len(drafted[False])
    assert len(drafted[True]) < len(text)  # multi-character tokens, not bytes


def test_json_guide_type_takes_no_guide_text_and_errors_quote_only_the_reason(engine):
    with pytest.raises(InvalidRequest, match="must be empty for guide type 'json_object'"):
        engine.grammar.check("json_object", '{"type": "integer"}')
    assert xgrammar_reason(RuntimeError("[17:32:59] /project/cpp/x.cc:50: bad schema")) == "bad schema"
