"""Times streamed answers as a client sees them, for loadtest/openai_stream.sh: time to
first token (request sent to the first event carrying text) and time per output token (the
first such event to the last, over the events after the first), per request.

Three ways to the same model: Triton's own `generate_stream` (`--kind generate` at Triton's
port), the gateway's `generate_stream` (`--kind generate` at the gateway's), and the
gateway's OpenAI `/v1/completions` with `stream: true` (`--kind openai`). `--concurrency`
clients each send their next request when the last one has ended, for `--duration` seconds
after `--warmup` unmeasured ones. Prints one JSON object.
"""
import argparse
import asyncio
import json
import statistics
import time

import aiohttp


def body(kind, model, prompt):
    if kind == "openai":
        return "/v1/completions", {"model": model, "prompt": prompt, "stream": True}
    return f"/v2/models/{model}/generate_stream", {"text_input": prompt}


def text_of(kind, data):
    """The text an event carries ("" for OpenAI's finish, usage and [DONE])."""
    if data == b"[DONE]":
        return ""
    event = json.loads(data)
    if kind == "openai":
        choices = event.get("choices") or [{}]
        return choices[0].get("text") or ""
    return event.get("text_output") or ""


async def one(session, url, kind, payload):
    started = time.monotonic()
    times = []
    async with session.post(url, json=payload) as answer:
        if answer.status != 200:
            raise RuntimeError(f"{answer.status}: {await answer.text()}")
        async for line in answer.content:
            if line.startswith(b"data:") and text_of(kind, line[5:].strip()):
                times.append(time.monotonic())
    if not times:
        raise RuntimeError("no event carried text")
    ttft = times[0] - started
    per_token = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
    return ttft, per_token, len(times)


async def client(session, url, kind, payload, until, samples, errors):
    while time.monotonic() < until:
        try:
            samples.append(await one(session, url, kind, payload))
        except Exception as error:  # counted and shown, never fatal
            errors.append(str(error)[:200])


def quantile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--kind", choices=["generate", "openai"], required=True)
    parser.add_argument("--model", default="echo_words")
    parser.add_argument("--words", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    vocabulary = ["one", "two", "three", "four", "five", "six", "a", "b", "c", "d"]
    prompt = " ".join(vocabulary[i % len(vocabulary)] for i in range(args.words))
    path, payload = body(args.kind, args.model, prompt)
    url = args.url + path
    connector = aiohttp.TCPConnector(limit=args.concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(args.warmup):
            await one(session, url, args.kind, payload)
        samples, errors = [], []
        started = time.monotonic()
        until = started + args.duration
        await asyncio.gather(
            *(client(session, url, args.kind, payload, until, samples, errors) for _ in range(args.concurrency))
        )
        elapsed = time.monotonic() - started
    ttft = [s[0] * 1e3 for s in samples]
    per_token = [s[1] * 1e3 for s in samples if s[1] is not None]
    print(json.dumps({
        "kind": args.kind,
        "concurrency": args.concurrency,
        "requests": len(samples),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "streams_per_s": len(samples) / elapsed,
        "tokens_per_answer": statistics.mean(s[2] for s in samples) if samples else 0,
        "ttft_ms": {"p50": quantile(ttft, 0.5), "p90": quantile(ttft, 0.9), "mean": statistics.mean(ttft)} if ttft else None,
        "per_token_ms": {"p50": quantile(per_token, 0.5), "p90": quantile(per_token, 0.9), "mean": statistics.mean(per_token)} if per_token else None,
    }))


asyncio.run(main())
