"""The embedded default's broker: kombu's filesystem transport with atomic writes.

kombu's `_put` creates the message file in the queue folder and then writes it, while `_get`
in another process may move and read that file in between, getting half a message: the task
is lost. Here a message is written in a sibling folder and renamed into the queue folder, so a
reader sees whole files or none. Selected by `OPENHUB_BROKER_URL=filesystem://`.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic

from kombu.transport import TRANSPORT_ALIASES, filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

ALIAS = "openhubfs"


class Channel(filesystem.Channel):
    """Filesystem channel whose messages appear in the queue folder atomically."""

    def _put(self, queue, payload, **kwargs):  # noqa: ANN001, ANN003, ANN202 - kombu's signature
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        staging = os.path.join(os.path.dirname(os.path.abspath(self.data_folder_out)), "broker-staging")
        os.makedirs(staging, exist_ok=True)
        temp = os.path.join(staging, name)
        with open(temp, "wb") as f:
            f.write(str_to_bytes(dumps(payload)))
        os.replace(temp, os.path.join(self.data_folder_out, name))


class Transport(filesystem.Transport):
    """The filesystem transport with `Channel` above."""

    Channel = Channel


def register() -> str:
    """Make `openhubfs://` resolve to this transport; returns the URL scheme to use."""
    TRANSPORT_ALIASES[ALIAS] = f"{__name__}:Transport"
    return f"{ALIAS}://"
