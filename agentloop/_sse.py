"""Server-sent events: the ``data`` payloads of a byte stream that arrives in arbitrary chunks."""

from __future__ import annotations


class SSEDecoder:
    """Feed bytes as they arrive; get back the ``data`` of each complete event.

    Lines end with LF, CRLF or CR; an empty line ends an event; the ``data`` lines of one
    event are joined with LF; comments and other fields are ignored (the completion APIs
    send only ``data``).
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []
        self._after_cr = False  # the last chunk ended with CR: an LF next is its other half

    def feed(self, chunk: bytes) -> list[str]:
        """The payloads of the events that ``chunk`` completes."""
        if self._after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
            self._after_cr = False
        if chunk:
            self._after_cr = chunk.endswith(b"\r")
        self._buffer += chunk
        events: list[str] = []
        while True:
            cut = _line_end(self._buffer)
            if cut is None:
                return events
            end, after = cut
            line = self._buffer[:end].decode("utf-8")
            self._buffer = self._buffer[after:]
            if not line:
                if self._data:
                    events.append("\n".join(self._data))
                    self._data = []
            elif line.startswith("data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(" ") else value)


def _line_end(buffer: bytes) -> tuple[int, int] | None:
    """Where the first line of ``buffer`` ends and the next begins, if it is complete."""
    lf, cr = buffer.find(b"\n"), buffer.find(b"\r")
    if cr == -1 or (lf != -1 and lf < cr):
        return None if lf == -1 else (lf, lf + 1)
    return (cr, cr + 2) if buffer[cr + 1 : cr + 2] == b"\n" else (cr, cr + 1)
