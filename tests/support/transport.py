"""A transport that records what serve's own HTTP server (http/server.py) writes, for tests that drive
its Connection by hand: no socket, every write and every change of the reading state seen."""

from __future__ import annotations

from typing import Any


class Transport:
    """Records writes and the reading state, as a uvloop TCP transport would see them."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.reading = True
        self.closed = False
        self.eof = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 8000 if name == "sockname" else 50000)

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        assert self.reading
        self.reading = False

    def resume_reading(self) -> None:
        assert not self.reading
        self.reading = True

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True
