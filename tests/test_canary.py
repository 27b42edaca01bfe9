"""The canary's request, its parsing of vLLM's answer, and the comparison of a replay with a record."""

from __future__ import annotations

import json

from warmstart.canary import (
    LOGPROB_TOLERANCE,
    PROMPTS,
    Answer,
    CanaryOutcome,
    CanaryRecord,
    compare,
    parse_answers,
    prompts_of,
    request_body,
)


def record(*answers: tuple[list[int], list[float]], latency: float = 0.2) -> CanaryRecord:
    return CanaryRecord(
        PROMPTS[: len(answers)],
        len(answers[0][0]),
        tuple(
            Answer(tuple(ids), tuple(lps), tuple({t: lp, t + 1: lp - 2.0} for t, lp in zip(ids, lps, strict=True)))
            for ids, lps in answers
        ),
        latency,
    )


def test_request_asks_vllm_for_token_ids_and_greedy_logprobs():
    body = request_body("served", PROMPTS, 24)
    assert body["temperature"] == 0 and body["ignore_eos"] is True
    assert body["logprobs"] == 5 and body["return_token_ids"] and body["return_tokens_as_token_ids"]
    assert body["prompt"] == list(PROMPTS) and body["model"] == "served"


def test_parse_reads_vllms_completion_shape():
    response = {
        "choices": [
            {
                "index": 1,
                "token_ids": [7, 8],
                "logprobs": {
                    "tokens": ["token_id:7", "token_id:8"],
                    "token_logprobs": [-0.1, -0.2],
                    "top_logprobs": [{"token_id:7": -0.1, "token_id:3": -2.5}, {"token_id:8": -0.2}],
                },
            },
            {
                "index": 0,
                "logprobs": {"tokens": ["token_id:1"], "token_logprobs": [None], "top_logprobs": [None]},
            },
        ]
    }
    first, second = parse_answers(response, 2)
    assert first.token_ids == (1,) and first.top == ({},)
    assert second == Answer((7, 8), (-0.1, -0.2), ({7: -0.1, 3: -2.5}, {8: -0.2}))


def test_a_record_survives_its_json_and_another_format_is_no_record():
    rec = record(([1, 2, 3], [-0.1, -0.2, -0.3]))
    assert CanaryRecord.from_json(json.loads(json.dumps(rec.to_json()))) == rec
    assert CanaryRecord.from_json({"format": 99}) is None
    assert CanaryRecord.from_json("x") is None


def test_equal_answers_within_the_tolerance_are_equal():
    rec = record(([1, 2, 3], [-0.1, -0.2, -0.3]))
    near = record(([1, 2, 3], [-0.1, -0.2 + LOGPROB_TOLERANCE / 2, -0.3]), latency=0.25)
    verdict = compare(rec, near)
    assert verdict.status == "equal" and not verdict.slow
    assert abs(verdict.latency_ratio - 1.25) < 1e-9


def test_another_token_is_a_mismatch_and_says_where():
    verdict = compare(record(([1, 2, 3], [-0.1, -0.2, -0.3])), record(([1, 9, 3], [-0.1, -0.2, -0.3])))
    assert verdict.status == "differs"
    assert verdict.detail == "prompt 1, token 2: 9 where the record has 2"


def test_a_logprob_beyond_the_tolerance_is_a_mismatch():
    verdict = compare(record(([1, 2], [-0.1, -0.2])), record(([1, 2], [-0.1, -0.2 - 2 * LOGPROB_TOLERANCE])))
    assert verdict.status == "differs" and "token 2: logprob" in verdict.detail


def test_a_near_tie_may_tip_the_other_way_and_ends_the_comparison():
    rec = CanaryRecord(
        PROMPTS[:1], 3, (Answer((1, 2, 3), (-0.7, -0.7, -0.1), ({1: -0.7}, {2: -0.7, 5: -0.71}, {})),), 1
    )
    tipped = CanaryRecord(PROMPTS[:1], 3, (Answer((1, 5, 4), (-0.7, -0.71, -0.3), ({}, {}, {})),), 1)
    assert compare(rec, tipped).status == "equal"
    clear = CanaryRecord(PROMPTS[:1], 3, (Answer((1, 6, 4), (-0.7, -0.71, -0.3), ({}, {}, {})),), 1)
    assert compare(rec, clear).status == "differs"


def test_a_much_slower_replay_is_flagged():
    assert compare(record(([1], [-0.1]), latency=0.1), record(([1], [-0.1]), latency=0.5)).slow


def test_other_prompts_are_not_compared():
    rec = record(([1], [-0.1]))
    other = CanaryRecord(("mine",), 1, rec.answers, 0.1)
    assert compare(rec, other).status == "skipped"
    assert prompts_of("mine") == ("mine",) and prompts_of(None) == PROMPTS


def test_outcome_line_says_what_and_what_was_done():
    outcome = CanaryOutcome("enforce", "differs", "generation 2: x", 0.5, actions=("volume generation 2 marked",))
    assert outcome.to_dict()["line"] == "differs (enforce, 0.50 s): generation 2: x; volume generation 2 marked"
