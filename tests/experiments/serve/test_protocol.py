"""experiments/serve/protocol.py: the prompt's forms, checked without pydantic's union (same answers, one message)."""
from __future__ import annotations

import pytest

pytest.importorskip("pydantic")

from experiments.serve.errors import APIError  # noqa: E402
from experiments.serve.protocol import CompletionRequest, completion_prompts  # noqa: E402


@pytest.mark.parametrize("prompt, want", [
    ("hi", ["hi"]), ([1, 2, 3], [[1, 2, 3]]), (["a", "b"], ["a", "b"]), ([[1], [2, 3]], [[1], [2, 3]]),
    ([[]], [[]]),       # an empty token-id list: _token_ids says it is empty
])
def test_the_four_forms(prompt, want):
    assert completion_prompts(CompletionRequest.model_validate({"prompt": prompt}).prompt) == want


@pytest.mark.parametrize("prompt", [None, 3, {"a": 1}, [1, "a"], ["a", 1], [1, True], [1.5], [[1], "a"], [[1, None]],
                                    (1, 2)])
def test_anything_else_is_one_400_naming_prompt(prompt):
    with pytest.raises(APIError) as e:
        completion_prompts(prompt)
    assert e.value.status == 400 and e.value.param == "prompt"
    assert str(e.value).startswith("prompt must be a string, a list of strings, a list of token ids or a list of "
                                   "token-id lists, got ")


def test_an_empty_list_says_so():
    with pytest.raises(APIError, match="prompt is empty"):
        completion_prompts([])
