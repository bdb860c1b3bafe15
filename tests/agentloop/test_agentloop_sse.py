"""Server-sent events decoding, whatever the chunking, and the two APIs' answers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentloop._dialects import Answer, BadAnswer, body, read_chunk, read_whole
from agentloop._sse import SSEDecoder

payloads = st.lists(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), max_size=40),
    max_size=8,
)


@given(payloads, st.sampled_from(["\n", "\r\n", "\r"]), st.data())
def test_events_survive_any_chunking(events: list[str], eol: str, data: st.DataObject) -> None:
    stream = "".join(f"data: {e}{eol}: a comment{eol}event: x{eol}{eol}" for e in events).encode()
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    decoder = SSEDecoder()
    got: list[str] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        got += decoder.feed(stream[start:end])
    assert got == events


def test_multi_line_data_is_joined_and_blank_lines_alone_are_no_events() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\ndata:b\n\n\n\ndata: [DONE]\n") == ["a\nb"]
    assert decoder.feed(b"\n") == ["[DONE]"]


def test_a_crlf_split_between_chunks_is_one_line_end() -> None:
    decoder = SSEDecoder()
    chunks = [b"data: x\r", b"\n", b"\r", b"\n", b"data: y\r", b"\n", b"\n"]
    assert [event for chunk in chunks for event in decoder.feed(chunk)] == ["x", "y"]


def test_request_bodies_use_each_apis_field_names() -> None:
    openai = body("openai", "p", model="m", max_tokens=3, temperature=0.5, stop=["x"], stream=True)
    assert openai == {
        "prompt": "p",
        "max_tokens": 3,
        "model": "m",
        "temperature": 0.5,
        "stop": ["x"],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sglang = body("sglang", "p", model="m", max_tokens=3, temperature=None, stop=(), stream=False)
    assert sglang == {"text": "p", "sampling_params": {"max_new_tokens": 3}}


def test_token_ids_go_in_each_apis_prompt_field() -> None:
    openai = body(
        "openai", [7, 8], model=None, max_tokens=3, temperature=None, stop=(), stream=False
    )
    assert openai == {"prompt": [7, 8], "max_tokens": 3}
    sglang = body(
        "sglang", [7, 8], model=None, max_tokens=3, temperature=None, stop=(), stream=False
    )
    assert sglang == {"input_ids": [7, 8], "sampling_params": {"max_new_tokens": 3}}


def test_a_single_stop_string_is_not_split_into_characters() -> None:
    for api in ("openai", "sglang"):
        sent = body(api, "p", model=None, max_tokens=3, temperature=None, stop="###", stream=False)
        params = sent if api == "openai" else sent["sampling_params"]
        assert params["stop"] == ["###"]


def test_openai_stream_adds_text_and_takes_usage_from_the_last_chunk() -> None:
    answer = Answer()
    read_chunk("openai", answer, {"choices": [{"text": "ab", "finish_reason": None}]})
    read_chunk("openai", answer, {"choices": [{"text": "c", "finish_reason": "stop"}]})
    read_chunk(
        "openai", answer, {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}}
    )
    assert answer == Answer("abc", "stop", 4, 3)


def test_sglang_stream_carries_the_whole_text_so_far() -> None:
    answer = Answer()
    for text, reason in (("a", None), ("ab", {"type": "length", "length": 2})):
        meta = {"finish_reason": reason, "prompt_tokens": 1, "completion_tokens": len(text)}
        read_chunk("sglang", answer, {"text": text, "meta_info": meta})
    assert answer == Answer("ab", "length", 1, 2)


@pytest.mark.parametrize(
    ("api", "data", "why"),
    [
        ("openai", [], "not a JSON object"),
        ("openai", {"choices": []}, "no 'choices'"),
        ("openai", {"choices": [{"text": 1}]}, "not a string"),
        ("openai", {"error": {"message": "boom"}}, "boom"),
        ("sglang", {"text": "x"}, "no 'meta_info'"),
        ("sglang", {"error": "overloaded"}, "overloaded"),
    ],
)
def test_answers_that_break_the_api_are_refused(api: str, data: object, why: str) -> None:
    with pytest.raises(BadAnswer, match=why):
        read_whole(api, data)  # type: ignore[arg-type]
