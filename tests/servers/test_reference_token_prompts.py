"""Prompts given as token IDs: vLLM's ``prompt`` and SGLang's ``input_ids``, as verl sends them."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from servers.reference.prompts import BadPrompt, parse
from servers.reference.tokenizer import VOCAB, decode, encode

if TYPE_CHECKING:
    # For annotations only: at run time the name `conftest` may mean tests/conftest.py.
    from conftest import ReferenceFactory

SHAPES = (
    "prompt must be a non-empty string, a list of strings, a list of token IDs "
    "or a list of token-ID lists"
)


async def post(http: aiohttp.ClientSession, url: str, body: object) -> tuple[int, Any]:
    async with http.post(url, json=body) as response:
        return response.status, await response.json()


ONE = [40, 41, 42]
BATCH = [[40, 41, 42], [7, 8]]


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
@pytest.mark.parametrize(
    ("prompt", "prompts"),
    [(ONE, [ONE]), (BATCH, BATCH), ([[5]], [[5]])],
    ids=["one", "batch", "batch-of-one"],
)
async def test_token_id_prompts_complete_like_their_text(
    reference_server: ReferenceFactory,
    http: aiohttp.ClientSession,
    dialect: str,
    prompt: list[Any],
    prompts: list[list[int]],
) -> None:
    async with asyncio.timeout(30), reference_server(dialect=dialect) as server:
        url = f"{server.url}/v1/completions"
        status, by_ids = await post(http, url, {"prompt": prompt, "max_tokens": 4})
        assert status == 200, by_ids
        texts = [decode(ids) for ids in prompts]
        _, by_text = await post(http, url, {"prompt": texts, "max_tokens": 4})
    given_ids = sum(len(ids) for ids in prompts)
    assert by_ids["usage"] == {
        "prompt_tokens": given_ids,
        "total_tokens": given_ids + 4 * len(prompts),
        "completion_tokens": 4 * len(prompts),
    }
    assert [c["text"] for c in by_ids["choices"]] == [c["text"] for c in by_text["choices"]]


@pytest.mark.parametrize(("input_ids", "single"), [(ONE, True), (BATCH, False), ([ONE], False)])
async def test_sglang_input_ids_answer_one_object_or_a_list(
    reference_server: ReferenceFactory,
    http: aiohttp.ClientSession,
    input_ids: list[Any],
    single: bool,
) -> None:
    body = {"input_ids": input_ids, "sampling_params": {"max_new_tokens": 3}}
    async with asyncio.timeout(30), reference_server(dialect="sglang") as server:
        status, out = await post(http, f"{server.url}/generate", body)
    assert status == 200, out
    assert isinstance(out, dict) == single
    outputs = [out] if single else out
    prompts = [input_ids] if single else input_ids
    assert [o["meta_info"]["prompt_tokens"] for o in outputs] == [len(p) for p in prompts]
    assert [len(o["output_ids"]) for o in outputs] == [3] * len(prompts)


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([], "prompt cannot be an empty list"),
        ([[]], "prompt[0] cannot be an empty list"),
        ([[1], []], "prompt[1] cannot be an empty list"),
        (["a", ""], "prompt[1] cannot be empty"),
        ([1, "a"], SHAPES),
        ([[1], 2], SHAPES),
        (["a", [1]], SHAPES),
        ([1, True], SHAPES),
        ([1.5], SHAPES),
        (7, SHAPES),
        (None, SHAPES),
        ([[1, "a"]], 'prompt[0] must hold only integer token IDs, got "a"'),
        ([[1, False]], "prompt[0] must hold only integer token IDs, got false"),
        ([1, -1], "prompt: token ID -1 is negative; token IDs are 0 to 95"),
        ([[1], [96]], "prompt[1]: token ID 96 is out of vocabulary; token IDs are 0 to 95"),
        ([5] * 600, "This model's maximum context length is 512 tokens."),
    ],
)
async def test_bad_openai_prompts_are_one_clear_400(
    reference_server: ReferenceFactory, http: aiohttp.ClientSession, prompt: object, message: str
) -> None:
    async with asyncio.timeout(30), reference_server() as server:
        body = {"prompt": prompt, "max_tokens": 2}
        status, out = await post(http, f"{server.url}/v1/completions", body)
    assert status == 400
    assert out["error"]["type"] == "BadRequestError"
    assert out["error"]["message"].startswith(message)
    assert "\n" not in out["error"]["message"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "Either text or input_ids should be provided."),
        ({"text": "a", "input_ids": [1]}, "Either text or input_ids should be provided."),
        ({"input_ids": []}, "input_ids cannot be an empty list"),
        ({"input_ids": [[2], []]}, "input_ids[1] cannot be an empty list"),
        ({"input_ids": "abc"}, "input_ids must be a list of token IDs or a list of token-ID lists"),
        ({"input_ids": ["a"]}, "input_ids must be a list of token IDs or a list of token-ID lists"),
        ({"input_ids": [[1], [-3]]}, "input_ids[1]: token ID -3 is negative"),
        ({"input_ids": [200]}, "input_ids: token ID 200 is out of vocabulary"),
        ({"text": [1, 2]}, "text must be a non-empty string or a list of strings"),
    ],
)
async def test_bad_sglang_prompts_are_one_clear_400(
    reference_server: ReferenceFactory,
    http: aiohttp.ClientSession,
    body: dict[str, Any],
    message: str,
) -> None:
    async with asyncio.timeout(30), reference_server(dialect="sglang") as server:
        status, out = await post(http, f"{server.url}/generate", body)
    assert status == 400
    assert out["type"] == "BadRequestError"
    assert out["message"].startswith(message)


token_lists = st.lists(st.integers(0, len(VOCAB) - 1), min_size=1, max_size=40)


@given(token_lists)
def test_any_valid_id_list_is_one_prompt_of_those_ids(ids: list[int]) -> None:
    assert parse(ids, "prompt") == ([ids], True)
    assert parse([ids, ids], "input_ids", text=False) == ([ids, ids], False)


@given(token_lists, st.integers().filter(lambda i: not 0 <= i < len(VOCAB)), st.data())
def test_one_id_outside_the_vocabulary_spoils_the_prompt(
    ids: list[int], bad: int, data: st.DataObject
) -> None:
    ids.insert(data.draw(st.integers(0, len(ids))), bad)
    with pytest.raises(BadPrompt, match=f"token ID {bad} is"):
        parse(ids, "prompt")


def test_text_prompts_keep_their_encoding() -> None:
    assert parse("hi", "prompt") == ([encode("hi")], True)
    assert parse(["hi", "yo"], "text", ids=False) == ([encode("hi"), encode("yo")], False)
