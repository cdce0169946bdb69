"""One streamed HTTP/1.1 request whose client does almost nothing while the answer streams.

The load test runs on loopback (bench/eval/loadtest.py), on the same cores as the server it measures, so the CPU
its client spends on each streamed event is taken from the server's steps and charged to the server.  A client
that parses as it reads (httpx: an h11 event per chunk, then a split into lines and a JSON document per event)
spends more per token than the server's own event loop does (`python -m bench.standalone.serve_cpu_split` counts
both; bench/by_hand.md, "the load test's client").  This one only notes when each read ended while the
answer streams; once the connection closes, h11 parses the whole answer and each piece of the body keeps the time
of the read that brought it, so a first token is timed as it arrived.
"""
from __future__ import annotations

import asyncio
import codecs
import json
import time
from dataclasses import dataclass, field
from typing import Iterator
from urllib.parse import urlsplit

import h11

from runtime.errors import UserError

READ_BYTES = 1 << 16
# The last bytes of a chunked body: worth parsing what came so far, in case the server keeps the connection open.
CHUNKED_END = b"0\r\n\r\n"

Read = tuple[float, bytes]  # when a read ended (time.perf_counter), and the bytes it brought


class AnswerError(UserError):
    """A server's answer that is not a complete HTTP/1.1 response."""


@dataclass
class Answer:
    status: int
    pieces: list[Read] = field(default_factory=list)  # the body's bytes, each with the time of the read that brought it
    ended_at: float = float("nan")  # the time of the read that ended the answer

    def text(self) -> str:
        return b"".join(data for _, data in self.pieces).decode(errors="replace")

    def lines(self) -> Iterator[tuple[float, str]]:
        """The body's lines (an event stream's), each with the time of the read that completed it."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        partial = ""
        at = float("nan")
        for at, data in self.pieces:
            *complete, partial = (partial + decoder.decode(data)).split("\n")
            for line in complete:
                yield at, line.removesuffix("\r")
        partial += decoder.decode(b"", final=True)
        if partial:
            yield at, partial.removesuffix("\r")


def request_bytes(host: str, path: str, body: dict) -> bytes:
    """A POST of `body` as JSON that asks the server to close the connection after its answer."""
    payload = json.dumps(body).encode()
    client = h11.Connection(h11.CLIENT)
    headers = [("Host", host), ("Content-Type", "application/json"), ("Content-Length", str(len(payload))),
               ("Connection", "close")]
    return b"".join([client.send(h11.Request(method="POST", target=path, headers=headers)),
                     client.send(h11.Data(data=payload)), client.send(h11.EndOfMessage())])


def parse_answer(reads: list[Read], closed: bool = True) -> Answer | None:
    """The response in `reads`, the bytes of a connection's reads in order; None when it has not ended yet and the
    connection is open (`closed` False).  Raises AnswerError when the bytes are not one complete HTTP/1.1 response."""
    parser = h11.Connection(h11.CLIENT)  # in the state of a client that has sent its request
    parser.send(h11.Request(method="POST", target="/", headers=[("Host", "answer"), ("Connection", "close")]))
    answer: Answer | None = None
    data = None
    try:
        for at, data in [*reads, (float("nan"), b"")] if closed else reads:
            parser.receive_data(data)
            while (event := parser.next_event()) not in (h11.NEED_DATA, h11.PAUSED):
                if isinstance(event, h11.Response):
                    answer = Answer(event.status_code)
                elif isinstance(event, h11.Data) and answer is not None:
                    answer.pieces.append((at, bytes(event.data)))
                elif isinstance(event, h11.EndOfMessage) and answer is not None:
                    answer.ended_at = at
                    return answer
                elif isinstance(event, h11.ConnectionClosed):
                    raise AnswerError("the server closed the connection before its answer ended")
    except h11.RemoteProtocolError as e:
        if data == b"":  # h11's complaint at the connection's end: a body cut short
            raise AnswerError("the server closed the connection before its answer ended") from None
        raise AnswerError(f"the server's answer is not valid HTTP/1.1: {e}") from None
    if closed:
        raise AnswerError("the server closed the connection before its answer ended")
    return None


async def post_streaming(url: str, path: str, body: dict) -> Answer:
    """POST `body` to `url` + `path` and read the answer to its end, timing each read."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise AnswerError(f"{url!r} is not an http:// address; the load test speaks plain HTTP/1.1")
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
    try:
        writer.write(request_bytes(parts.netloc, path, body))
        reads: list[Read] = []
        while data := await reader.read(READ_BYTES):
            reads.append((time.perf_counter(), data))
            if data.endswith(CHUNKED_END) and (answer := parse_answer(reads, closed=False)) is not None:
                return answer
        return parse_answer(reads)
    finally:
        writer.close()
