"""Request bodies of /v1/completions and /v1/chat/completions, and their checks.

    req = CompletionRequest.model_validate(json_body)   # pydantic: types (strict; a bad type names the field)
    params = sampling(req, ...)                          # APIError(400) naming the field of a bad value

Fields beyond OpenAI's are vLLM's extensions: `top_k` (-1 or 0: off), `ignore_eos`, `stop_token_ids`,
`return_token_ids` (token ids of the prompt and of each choice in the response), `priority` (lower is
more important: what scheduler=priority and the victim policies read), chat's
`add_generation_prompt` and `chat_template_kwargs`. OpenAI fields the engine does not implement
(logprobs, penalties, logit_bias, echo, suffix, best_of > n, tools, ...) are accepted at their
no-op values and refused with a 400 naming the field otherwise; unknown fields are ignored and logged,
as vLLM does.
"""
from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from experiments.serve.errors import APIError

MAX_N = 128                 # choices per request
MAX_STOP = 16               # stop strings per request


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    include_usage: bool = False


class _GenerationRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    model: Optional[str] = None             # None: the served model
    max_tokens: Optional[int] = None
    temperature: Optional[float] = None     # None: 1.0 (OpenAI's default); 0: greedy
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[int]] = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    n: int = 1
    return_token_ids: bool = False
    priority: int = 0                       # lower is more important (scheduler=priority; vLLM's extension)
    user: Optional[str] = None
    # accepted only at their no-op values (checked in unsupported())
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    repetition_penalty: Optional[float] = None
    logit_bias: Optional[dict[str, Any]] = None
    min_tokens: Optional[int] = None


class CompletionRequest(_GenerationRequest):
    # str | list[str] | list[int] | list[list[int]], checked by completion_prompts: pydantic's union tries each
    # branch on a long token-id list (~30 us a 400-token prompt), the check looks at the first item
    prompt: Any
    logprobs: Optional[int] = None
    echo: bool = False
    suffix: Optional[str] = None
    best_of: Optional[int] = None


class ChatCompletionRequest(_GenerationRequest):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: Optional[int] = None
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = None
    tools: Optional[list[Any]] = None
    tool_choice: Optional[Any] = None
    response_format: Optional[dict[str, Any]] = None
    add_generation_prompt: bool = True
    chat_template_kwargs: Optional[dict[str, Any]] = None


_NO_OP = {"presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
          "repetition_penalty": (None, 1, 1.0), "min_tokens": (None, 0), "logprobs": (None, False),
          "echo": (False,), "suffix": (None, ""), "top_logprobs": (None, 0), "tool_choice": (None, "none")}


_NO_OP_OF: dict = {}        # request class -> the (name, no-op values) of _NO_OP it has


def unsupported(req: _GenerationRequest) -> None:
    """APIError(400) for an OpenAI field set to a value the engine does not implement."""
    cls = type(req)
    no_ops = _NO_OP_OF.get(cls)
    if no_ops is None:
        no_ops = _NO_OP_OF[cls] = tuple((n, ok) for n, ok in _NO_OP.items() if n in cls.model_fields)
    for name, ok in no_ops:
        value = getattr(req, name)
        # by type as well as value: logprobs=0 asks for the sampled token's logprob, it is not False
        if not any(type(value) is type(o) and value == o for o in ok):
            raise APIError(400, f"{name}={getattr(req, name)!r} is not supported by this server; leave {name} "
                                f"out (or at {ok[-1]!r})", param=name)
    if req.logit_bias:
        raise APIError(400, "logit_bias is not supported by this server; leave it out", param="logit_bias")
    best_of = getattr(req, "best_of", None)
    if best_of is not None and best_of != req.n:
        raise APIError(400, f"best_of={best_of} is not supported (only best_of = n = {req.n}); leave it out",
                       param="best_of")
    if getattr(req, "tools", None):
        raise APIError(400, "tools are not supported by this server; leave tools out", param="tools")
    fmt = getattr(req, "response_format", None)
    if fmt and fmt.get("type", "text") != "text":
        raise APIError(400, f"response_format {fmt.get('type')!r} is not supported (only 'text')",
                       param="response_format")


def check_common(req: _GenerationRequest, vocab_size: int) -> dict:
    """The sampling values of req, checked (APIError 400 naming the field): a dict of SamplingParams
    keyword arguments less max_tokens, plus `stop` (list[str]) and `stop_token_ids` (list[int])."""
    t = 1.0 if req.temperature is None else req.temperature
    if not t >= 0 or t != t or t == float("inf"):
        raise APIError(400, f"temperature must be a finite number >= 0 (0: greedy), got {t}", param="temperature")
    top_p = 1.0 if req.top_p is None else req.top_p
    if not 0.0 < top_p <= 1.0:
        raise APIError(400, f"top_p must be in (0, 1], got {top_p}", param="top_p")
    top_k = 0 if req.top_k is None else req.top_k
    if top_k < -1:
        raise APIError(400, f"top_k must be -1 or 0 (off) or a positive count, got {top_k}", param="top_k")
    seed = req.seed
    if seed is not None and not 0 <= seed < 2 ** 63:
        raise APIError(400, f"seed must be in [0, 2**63), got {seed}", param="seed")
    if not 1 <= req.n <= MAX_N:
        raise APIError(400, f"n must be in [1, {MAX_N}], got {req.n}", param="n")
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stop) > MAX_STOP:
        raise APIError(400, f"stop has {len(stop)} strings, at most {MAX_STOP} are accepted", param="stop")
    if any(s == "" for s in stop):
        raise APIError(400, "stop strings must not be empty", param="stop")
    stop_ids = list(req.stop_token_ids or [])
    bad = [i for i in stop_ids if not 0 <= i < vocab_size]
    if bad:
        raise APIError(400, f"stop_token_ids must be in [0, {vocab_size}) (vocab_size), got {bad[0]}",
                       param="stop_token_ids")
    return dict(temperature=t, top_p=top_p, top_k=max(top_k, 0), seed=seed, ignore_eos=req.ignore_eos,
                stop=stop, stop_token_ids=stop_ids)


_TOKEN_IDS = TypeAdapter(list[int], config=ConfigDict(strict=True))
_PROMPT_LISTS = TypeAdapter(Union[list[str], list[list[int]]], config=ConfigDict(strict=True))


def completion_prompts(prompt) -> list:
    """The prompts of a completion request (a string, a list of token ids, or a list of either): a list of
    strings and token-id lists, one per prompt; APIError(400) naming `prompt` for anything else."""
    if type(prompt) is str:
        return [prompt]
    if type(prompt) is list and prompt:
        try:
            if type(prompt[0]) is int:
                return [_TOKEN_IDS.validate_python(prompt)]
            return list(_PROMPT_LISTS.validate_python(prompt))
        except ValidationError:
            pass
    elif type(prompt) is list:
        raise APIError(400, "prompt is empty; give a string, a list of token ids, or a list of either",
                       param="prompt")
    raise APIError(400, "prompt must be a string, a list of strings, a list of token ids or a list of "
                        f"token-id lists, got {str(prompt)[:80]!r}", param="prompt")


def chat_messages(messages: list[dict]) -> list[dict]:
    """Messages for the chat template: a role each, content a string (text parts joined) or absent."""
    out = []
    for i, m in enumerate(messages):
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise APIError(400, f"messages[{i}].role must be a non-empty string, got {role!r}",
                           param=f"messages[{i}].role")
        content = m.get("content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise APIError(400, f"messages[{i}].content[{j}] must be a text part "
                                        f"({{'type': 'text', 'text': ...}}); other content types are not supported",
                                   param=f"messages[{i}].content[{j}]")
                texts.append(part["text"])
            content = "".join(texts)
        elif content is not None and not isinstance(content, str):
            raise APIError(400, f"messages[{i}].content must be a string or a list of text parts, got "
                                f"{type(content).__name__}", param=f"messages[{i}].content")
        out.append({**m, "content": content})
    return out
