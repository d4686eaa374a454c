"""The embedded broker keeps the order messages were sent in (a split's children go in list order)."""

from __future__ import annotations

from kombu import Connection

from openhub.fsbroker import register


def test_messages_sent_in_one_millisecond_are_read_in_the_order_sent(tmp_path) -> None:  # noqa: ANN001
    folder = tmp_path / "broker"
    folder.mkdir()
    options = {"data_folder_in": str(folder), "data_folder_out": str(folder), "store_processed": False}
    with Connection(register(), transport_options=options) as conn:
        channel = conn.default_channel
        for n in range(300):  # far more than one millisecond holds
            channel._put("q", {"n": n})
        assert [channel._get("q")["n"] for _ in range(300)] == list(range(300))


def test_its_url_names_a_host_so_kombu_warns_of_none(tmp_path, caplog) -> None:  # noqa: ANN001
    # kombu warned "No hostname was supplied" on every connection: noise in every worker's console.
    options = {"data_folder_in": str(tmp_path), "data_folder_out": str(tmp_path)}
    with caplog.at_level("WARNING", logger="kombu.connection"), Connection(register(), transport_options=options) as c:
        c.info()
    assert "No hostname" not in caplog.text
