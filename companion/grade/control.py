"""One JSON message from a control socket: the class worker's (:mod:`.classworker`) and the zygote's
(:mod:`.forkserver`) answers are read the same way.
"""

from __future__ import annotations

import json
import socket


class ControlLost(Exception):
    """The other side closed the socket, or sent something that is not a JSON object."""


def receive_json(control: socket.socket, seconds: float | None) -> dict:
    """The next message on ``control`` (a ``SOCK_SEQPACKET`` socket), waiting up to ``seconds`` (None: for ever).

    Raises ``TimeoutError`` when nothing came in time, :class:`ControlLost` otherwise.
    """
    control.settimeout(seconds)
    try:
        data = control.recv(1 << 16)
    except TimeoutError:
        raise TimeoutError() from None
    except OSError as error:
        raise ControlLost(str(error)) from None
    if not data:
        raise ControlLost("the other side closed the socket")
    try:
        message = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ControlLost("an answer that is not JSON") from None
    if not isinstance(message, dict):
        raise ControlLost("an answer that is not an object")
    return message
