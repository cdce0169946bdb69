"""The load test's client (bench/eval/stream_client.py, bench/eval/loadtest.py) reading servers' answers: a
streamed answer's events keep the time of the read that brought them however the bytes were split, and any bytes
a server may send -- not HTTP, cut short, events of the wrong shape -- give a request an error, never a crash."""
from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.eval.loadtest import one_request, outcome_of
from bench.eval.stream_client import AnswerError, parse_answer, post_streaming
from tests.hostile import attempt, examples


def chunked(*parts: bytes, last: bool = True) -> bytes:
    """`parts` as chunks of a chunked body; with its end when `last`."""
    return b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts) + (b"0\r\n\r\n" if last else b"")


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
EVENTS = [b'event: token\ndata: {"token": 11, "text": "a"}\n\n', b'event: token\ndata: {"token": 12, "text": "b"}\n\n',
          b'event: done\ndata: {"tokens": 2}\n\n']
GENERATE_STREAM = HEAD + chunked(*EVENTS)


def split_at(data: bytes, cuts: list[int]) -> list[tuple[float, bytes]]:
    """`data` as reads ending at the sorted `cuts`, read i at time i."""
    edges = [0, *sorted(set(c for c in cuts if 0 < c < len(data))), len(data)]
    return [(float(i), data[a:b]) for i, (a, b) in enumerate(zip(edges, edges[1:]))]


@given(st.lists(st.integers(1, len(GENERATE_STREAM) - 1), max_size=12))
@examples(60)
def test_a_streamed_answer_reads_the_same_however_it_was_split_and_times_each_line_by_its_read(cuts):
    reads = split_at(GENERATE_STREAM, cuts)
    answer = parse_answer(reads)
    assert answer.status == 200 and answer.text() == b"".join(EVENTS).decode()
    first_token_line_ends = GENERATE_STREAM.index(b'"a"}\n') + len(b'"a"}\n')
    arrived = next(at for at, data in reads if sum(len(d) for t, d in reads if t <= at) >= first_token_line_ends)
    outcome = outcome_of(answer, "/generate", start=-1.0)
    assert (outcome.status, outcome.tokens, outcome.error) == (200, 2, None)
    assert outcome.ttft_s == arrived + 1.0
    assert outcome.latency_s == reads[-1][0] + 1.0  # the read that brought the last chunk


def test_an_error_answer_with_a_length_gives_its_status_and_text():
    body = b'{"error": {"message": "max_new_tokens must be at least 1"}}'
    answer = parse_answer([(0.5, b"HTTP/1.1 422 Unprocessable Entity\r\ncontent-length: %d\r\n\r\n%s"
                            % (len(body), body))])
    outcome = outcome_of(answer, "/generate", start=0.0)
    assert outcome.status == 422 and "max_new_tokens must be at least 1" in outcome.error


def test_an_answer_cut_short_is_an_error_naming_the_closed_connection():
    all_but_the_end = split_at(GENERATE_STREAM, [len(GENERATE_STREAM) - 10])[:-1]
    with pytest.raises(AnswerError, match="closed the connection before its answer ended"):
        parse_answer(all_but_the_end)
    assert parse_answer(all_but_the_end, closed=False) is None  # still open: more may come


def test_a_stream_without_its_last_event_or_with_an_event_of_the_wrong_shape_is_an_error():
    no_done = outcome_of(parse_answer([(0.0, HEAD + chunked(*EVENTS[:2]))]), "/generate", 0.0)
    assert no_done.error == "the stream ended without a done event"
    wrong = outcome_of(parse_answer([(0.0, HEAD + chunked(b"event: token\ndata: [1, 2]\n\n"))]), "/generate", 0.0)
    assert wrong.error.startswith("an event of the stream is not one the load test reads")
    completion = outcome_of(parse_answer([(0.0, HEAD + chunked(b'data: {"choices": [{"text": "x"}]}\n\n'))]),
                            "/v1/completions", 0.0)
    assert completion.error == "the stream ended without [DONE]"


@given(st.binary(max_size=400), st.lists(st.integers(1, 399), max_size=6), st.booleans())
@examples(150)
def test_any_bytes_from_a_server_give_an_answer_or_one_line_naming_the_fault(noise, cuts, after_a_head):
    data = (HEAD + noise) if after_a_head else noise
    reads = split_at(data, cuts)
    answer = []
    if attempt("load test answers", lambda: answer.append(parse_answer(reads))) == "worked":
        for route in ("/generate", "/v1/completions"):  # whatever its events, the request's outcome says so
            outcome = outcome_of(answer[0], route, 0.0)
            assert outcome.status == answer[0].status and (outcome.status != 200) <= (outcome.error is not None)


def test_a_request_to_a_server_that_streams_is_timed_and_one_that_is_gone_is_an_error():
    async def serve_then_request():
        async def answer(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(HEAD + chunked(EVENTS[0], last=False))
            await writer.drain()
            await asyncio.sleep(0.5)  # far longer than a busy host delays a read
            writer.write(chunked(*EVENTS[1:]))
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            streamed = await one_request(f"http://127.0.0.1:{port}", {"prompt": "x"}, timeout_s=10)
            raw = await post_streaming(f"http://127.0.0.1:{port}", "/generate", {"prompt": "x"})
        gone = await one_request(f"http://127.0.0.1:{port}", {"prompt": "x"}, timeout_s=10)
        return streamed, raw, gone

    streamed, raw, gone = asyncio.run(serve_then_request())
    assert (streamed.status, streamed.tokens, streamed.error) == (200, 2, None)
    assert 0 < streamed.ttft_s < streamed.latency_s  # the first token timed at its own read, not at the end
    assert [json.loads(line[6:]) for _, line in raw.lines() if line.startswith("data: ")][-1] == {"tokens": 2}
    assert gone.status == 0 and gone.error.startswith("ConnectionRefusedError")


def test_an_answer_complete_on_a_connection_the_server_keeps_open_ends_the_request_at_once():
    """A server that ignores `Connection: close`: the request ends with its answer's last chunk, not at a timeout."""
    async def serve_then_request():
        answered = asyncio.Event()

        async def answer(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(GENERATE_STREAM)
            await writer.drain()
            await answered.wait()  # the connection stays open until the client has its outcome
            writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        async with server:
            # A client that waited for the close would time out (status 0, a TimeoutError), however busy the host.
            outcome = await one_request(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", {}, timeout_s=60)
            answered.set()
            return outcome

    outcome = asyncio.run(serve_then_request())
    assert (outcome.status, outcome.tokens, outcome.error) == (200, 2, None)


def test_an_address_that_is_not_plain_http_is_refused_in_one_line():
    with pytest.raises(AnswerError, match="is not an http:// address"):
        asyncio.run(post_streaming("https://127.0.0.1:1", "/generate", {}))
