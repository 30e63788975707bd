"""A minimal keep-alive HTTP/1.1 client over asyncio streams, so the Python generator costs little CPU.

httpx spends several hundred microseconds of CPU per request; this spends a few tens, which keeps a
load generator on the same two cores from taking the service's share.
"""

from __future__ import annotations

import asyncio
import re

_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)
_CHUNKED = re.compile(rb"\r\ntransfer-encoding:\s*chunked", re.IGNORECASE)
_CLOSE = re.compile(rb"\r\nconnection:\s*close", re.IGNORECASE)


class HttpConnection:
    """One persistent connection; requests on it are sequential, like an executor's calls."""

    def __init__(self, host: str, port: int, authorization: str) -> None:
        self.host = host
        self.port = port
        self._auth = authorization.encode("ascii")
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        return self._reader, self._writer

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        """Send one request and read the whole answer: (status, body)."""
        reader, writer = await self._connect()
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        ).encode("ascii")
        writer.write(head + b"Authorization: " + self._auth + b"\r\n\r\n" + body)
        try:
            header = await reader.readuntil(b"\r\n\r\n")
            status = int(header[9:12])
            length = _CONTENT_LENGTH.search(header)
            if length is not None:
                payload = await reader.readexactly(int(length.group(1)))
            elif _CHUNKED.search(header):
                payload = await _read_chunked(reader)
            else:
                raise ConnectionError("answer without a length")
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            await self.close()
            raise
        if _CLOSE.search(header):
            await self.close()
        return status, payload

    async def close(self) -> None:
        """Close the connection (the next request opens a new one)."""
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, OSError):
                pass  # the peer went first; nothing left to release


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)
