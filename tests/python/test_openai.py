"""The official `openai` package against infergate's OpenAI endpoints (run by tests/openai.rs).

The model, echo_words, echoes its rendered prompt's words one event at a time, 150 ms apart;
its tokenizer counts one token per word, and its chat template writes `role: content` lines
and then `assistant:`.
"""
import json
import os
import time

import openai
import pytest

URL = os.environ["INFERGATE_OPENAI_URL"]
PLAIN_URL = os.environ["INFERGATE_PLAIN_URL"]
MODEL = "echo_words"


@pytest.fixture(scope="module")
def client():
    return openai.OpenAI(base_url=URL, api_key="unused", max_retries=0)


def tokens(text):
    """The tokenizer's count: word level over whitespace (checked against tokenizer.json)."""
    with open(os.environ["ECHO_TOKENIZER"]) as f:
        tokenizer = json.load(f)
    assert tokenizer["model"]["type"] == "WordLevel"
    assert tokenizer["pre_tokenizer"]["type"] == "WhitespaceSplit"
    return len(text.split())


def rendered(messages):
    return "".join(f"{m['role']}: {m['content'].strip()}\n" for m in messages) + "assistant:"


def test_models_lists_the_model(client):
    assert MODEL in [m.id for m in client.models.list()]


def test_chat(client):
    messages = [{"role": "system", "content": "one two"}, {"role": "user", "content": "three"}]
    answer = client.chat.completions.create(model=MODEL, messages=messages, temperature=0.5, top_p=0.9, seed=3)
    prompt = rendered(messages)
    assert answer.object == "chat.completion"
    assert answer.model == MODEL
    assert answer.id.startswith("chatcmpl-")
    choice = answer.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == " ".join(prompt.split())
    assert choice.finish_reason == "stop"
    assert answer.usage.prompt_tokens == tokens(prompt)
    assert answer.usage.completion_tokens == tokens(choice.message.content)
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens


def test_completion_honours_max_tokens(client):
    answer = client.completions.create(model=MODEL, prompt="one two three four", max_tokens=2)
    assert answer.object == "text_completion"
    assert answer.choices[0].text == "one two"
    assert answer.choices[0].finish_reason == "length"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (4, 2)


def test_completion_honours_stop(client):
    answer = client.completions.create(model=MODEL, prompt="a b c d", stop=["c"])
    assert answer.choices[0].text == "a b"
    assert answer.choices[0].finish_reason == "stop"


def timed(stream):
    arrivals, chunks = [], []
    started = time.monotonic()
    for chunk in stream:
        arrivals.append(time.monotonic() - started)
        chunks.append(chunk)
    return arrivals, chunks


def assert_one_at_a_time(arrivals):
    """Each word's chunk came when the model sent it (150 ms apart), not all at the end."""
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert all(gap > 0.075 for gap in gaps), f"chunks were held back: {arrivals}"


def test_chat_streams_chunk_by_chunk_with_usage(client):
    messages = [{"role": "user", "content": "one two three four"}]
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, stream=True, stream_options={"include_usage": True}
    )
    arrivals, chunks = timed(stream)
    words = rendered(messages).split()
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) == len(words)
    assert_one_at_a_time(arrivals[: len(content)])
    assert content[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert "".join(c.choices[0].delta.content for c in content) == " ".join(words)
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finish] == ["stop"]
    usage = chunks[-1]
    assert usage.choices == []
    assert usage.usage.prompt_tokens == len(words)
    assert usage.usage.completion_tokens == len(words)


def test_completion_streams(client):
    stream = client.completions.create(model=MODEL, prompt="one two three", max_tokens=2, stream=True)
    arrivals, chunks = timed(stream)
    texts = [c.choices[0].text for c in chunks if c.choices[0].text]
    assert texts == ["one", " two"]
    assert_one_at_a_time(arrivals[:2])
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chunks)


def refusal(call):
    with pytest.raises(openai.BadRequestError) as refused:
        call()
    error = refused.value.body
    assert set(error) >= {"message", "type", "param", "code"}, error
    assert error["type"] == "invalid_request_error"
    assert refused.value.status_code == 400
    return error


def test_malformed_messages_are_refused(client):
    error = refusal(lambda: client.chat.completions.create(model=MODEL, messages="hello"))
    assert error["param"] == "messages"
    error = refusal(lambda: client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": 5}]))
    assert error["param"] == "messages[0].content"


def test_an_unknown_role_is_refused(client):
    messages = [{"role": "wizard", "content": "hi"}]
    error = refusal(lambda: client.chat.completions.create(model=MODEL, messages=messages))
    assert error["param"] == "messages[0].role"
    assert "wizard" in error["message"]


def test_more_than_one_choice_is_refused(client):
    error = refusal(lambda: client.completions.create(model=MODEL, prompt="a", n=2))
    assert error["param"] == "n"


def test_an_unsupported_parameter_is_refused_not_dropped(client):
    error = refusal(lambda: client.completions.create(model=MODEL, prompt="a", presence_penalty=0.5))
    assert error["param"] == "presence_penalty"
    error = refusal(lambda: client.completions.create(model=MODEL, prompt="a", extra_body={"top_k": 3}))
    assert error["param"] == "top_k"


def test_a_prompt_past_the_context_is_refused(client):
    """echo_words' tokenizer_config.json says model_max_length 24: the prompt's tokens plus
    max_tokens may not pass it, as OpenAI refuses it."""
    words = lambda n: " ".join(["a"] * n)
    error = refusal(lambda: client.completions.create(model=MODEL, prompt=words(25)))
    assert (error["code"], error["param"]) == ("context_length_exceeded", "prompt")
    assert "maximum context length is 24 tokens" in error["message"]
    error = refusal(lambda: client.completions.create(model=MODEL, prompt=words(20), max_tokens=5))
    assert "25 tokens (20 in the prompt, 5 in the completion)" in error["message"]
    assert client.completions.create(model=MODEL, prompt=words(20), max_tokens=4).choices[0].text == words(4)
    # user: + 23 words + assistant: is 25 tokens.
    error = refusal(lambda: client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": words(23)}]))
    assert (error["code"], error["param"]) == ("context_length_exceeded", "messages")


def test_an_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="no_such_model", prompt="a")
    assert missing.value.body["code"] == "model_not_found"


def test_a_model_without_a_chat_template_serves_completions_only():
    plain = openai.OpenAI(base_url=PLAIN_URL, api_key="unused", max_retries=0)
    error = refusal(lambda: plain.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a"}]))
    assert "chat template" in error["message"]
    answer = plain.completions.create(model=MODEL, prompt="a b")
    assert answer.choices[0].text == "a b"
    assert answer.usage.completion_tokens == 2
    # [[models]] context_length = 4 there wins over its tokenizer_config.json's 24.
    error = refusal(lambda: plain.completions.create(model=MODEL, prompt="a b c d e"))
    assert error["code"] == "context_length_exceeded"
