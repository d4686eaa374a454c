"""The embedded default's broker: kombu's filesystem transport with atomic writes.

kombu's `_put` creates the message file in the queue folder and then writes it, while `_get`
in another process may move and read that file in between, getting half a message: the task
is lost. Here a message is written in a sibling folder and renamed into the queue folder, so a
reader sees whole files or none, and a reader takes a file by renaming it out of the queue
folder, so exactly one reader gets it. Selected by `OPENHUB_BROKER_URL=filesystem://`.

Like the Redis broker (openhub.celery.redisbroker), it keeps the hub's mark (a file beside the messages: gone
when the folder was emptied) and shows the messages waiting in a queue, so that the poller finds the
chains lost with them in seconds.
"""

from __future__ import annotations

import itertools
import os
import uuid
from queue import Empty
from time import monotonic_ns
from typing import Any, Collection

from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

_sequence = itertools.count()
MARK = "openhub.mark"  # the hub's mark, beside the messages (no message's name: "<stamp>.<queue>.msg")


class Channel(filesystem.Channel):
    """Filesystem channel whose messages appear in the queue folder atomically, in the order sent."""

    def _put(self, queue, payload, **kwargs):
        # Names sort in the order messages were sent: kombu's millisecond stamp and a random uuid put
        # two messages of one millisecond (a split's children, published in list order) in any order.
        name = f"{monotonic_ns():020d}_{os.getpid():08d}_{next(_sequence):012d}_{uuid.uuid4().hex}.{queue}.msg"
        staging = os.path.join(os.path.dirname(os.path.abspath(self.data_folder_out)), "broker-staging")
        os.makedirs(staging, exist_ok=True)
        temp = os.path.join(staging, name)
        with open(temp, "wb") as f:
            f.write(str_to_bytes(dumps(payload)))
        os.replace(temp, os.path.join(self.data_folder_out, name))

    def has_mark(self) -> bool:
        """Whether the hub's mark is in the queue folder (gone with its messages when it was emptied)."""
        return os.path.exists(os.path.join(self.data_folder_in, MARK))

    def put_mark(self) -> None:
        """Put the hub's mark in the queue folder."""
        os.makedirs(self.data_folder_in, exist_ok=True)
        with open(os.path.join(self.data_folder_in, MARK), "a"):
            pass

    def waiting_messages(self, queues: Collection[str], most: int) -> list[dict[str, Any]] | None:
        """The task messages waiting in `queues`, not those workers took; None when there are more than `most`."""
        suffixes = {f"{queue}.msg" for queue in queues}
        names = [n for n in os.listdir(self.data_folder_in) if n.partition(".")[2] in suffixes]
        if len(names) > most:
            return None
        waiting = []
        for name in names:
            try:
                with open(os.path.join(self.data_folder_in, name), "rb") as f:
                    waiting.append(loads(bytes_to_str(f.read())))
            except FileNotFoundError:  # taken by a worker meanwhile
                continue
        return waiting

    def _get(self, queue):
        # kombu moves the file to tempfile.gettempdir(), which is a copy (not a rename) when /tmp
        # is another filesystem: two consumers could then both read one message. A rename into a
        # sibling folder of the queue folder is atomic: exactly one consumer gets each file.
        reading = os.path.join(os.path.dirname(os.path.abspath(self.data_folder_in)), "broker-reading")
        os.makedirs(reading, exist_ok=True)
        for name in sorted(os.listdir(self.data_folder_in)):
            if name.partition(".")[2] != f"{queue}.msg":
                continue
            taken = os.path.join(reading, name)
            try:
                os.rename(os.path.join(self.data_folder_in, name), taken)
            except OSError:
                continue  # another consumer took it
            with open(taken, "rb") as f:
                payload = f.read()
            os.remove(taken)
            return loads(bytes_to_str(payload))
        raise Empty()


class Transport(filesystem.Transport):
    """The filesystem transport with `Channel` above."""

    Channel = Channel
