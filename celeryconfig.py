"""Celery's configuration for openhub: the one configuration file (README.md, "Running it for real").

Every value comes from an OPENHUB_* environment variable through `openhub.core.config`; the
settings that durability relies on are set here explicitly and not left to Celery's defaults.
"""

import os

from openhub.core.config import get_settings

_s = get_settings()

broker_url = _s.broker_url
broker_connection_retry_on_startup = True

# Durability: a task is acknowledged only after it ran, and a task whose worker died is put back.
task_acks_late = True
task_reject_on_worker_lost = True
worker_prefetch_multiplier = 1

# Only JSON crosses the broker (never pickle).
task_serializer = "json"
result_serializer = "json"
accept_content = ["json"]
event_serializer = "json"

# The database is the source of truth; results are never stored in Celery.
task_ignore_result = True
task_store_errors_even_if_ignored = False

# Flower: task events on, so step tasks show up by name with their arguments from the moment a worker
# receives them. A task-sent event per published task would cost the publisher a second broker message
# (a sixth of submit_many's CPU) to show a task while it waits in the queue, where the admin page shows
# the message waiting anyway (NEW, or IN_QUEUE when re-driven): OPENHUB_TASK_SENT_EVENTS=1 turns it on.
worker_send_task_events = True
task_send_sent_event = os.environ.get("OPENHUB_TASK_SENT_EVENTS", "").lower() in ("1", "true", "yes")

task_default_queue = "openhub"
timezone = "UTC"
enable_utc = True

# Redis re-delivers an unacknowledged task after the visibility timeout: it must exceed the
# longest step (tasks/ refuses to start a worker whose routes have a longer step timeout).
visibility_timeout = float(os.environ.get("OPENHUB_VISIBILITY_TIMEOUT", 3600))
# openhub's transports are named, not imported: under `celery worker -P gevent` this file is read while
# gevent is still patching (openhub/core/concurrency.py), and kombu's transports imported then would keep
# the unpatched time.sleep and select.select.
if broker_url.startswith("filesystem"):
    broker_url = "filesystem://localhost//"  # the host is unused; without one kombu warns on every connection
    broker_transport = "openhub.celery.fsbroker:Transport"  # the filesystem transport with atomic writes
    _broker_dir = os.path.join(str(_s.var_dir), "broker")
    broker_transport_options = {
        "data_folder_in": _broker_dir,
        "data_folder_out": _broker_dir,
        "processed_folder": os.path.join(str(_s.var_dir), "broker-processed"),
        "control_folder": os.path.join(str(_s.var_dir), "broker-control"),
        "store_processed": False,
        "polling_interval": float(os.environ.get("OPENHUB_BROKER_POLL", 0.05)),
    }
    for _d in (_broker_dir, broker_transport_options["processed_folder"], broker_transport_options["control_folder"]):
        os.makedirs(_d, exist_ok=True)
elif _s.broker == "amqp":
    # RabbitMQ (README.md, "Brokers"). Queues are classic, durable (kombu's default) and priority queues
    # (x-max-priority 9, the hub's 0-9 scale, higher = sooner): quorum queues would survive the loss of a
    # node, but RabbitMQ 3.10 gives them no priorities. Task messages are persistent (Celery's default).
    # Publisher confirms: a publish returns once RabbitMQ has the message (written, for a persistent one
    # on a durable queue); one it refuses (nack) raises, and the message stays due in the store for the
    # poller. Unacknowledged deliveries go back to their queue when the worker's connection or channel
    # closes (a worker killed, a connection cut, a heartbeat missed, RabbitMQ's consumer_timeout).
    broker_transport_options = {"confirm_publish": True}
    task_queue_max_priority = 9
    # Tasks published without a priority (the poller's, confirmations, a chain's error callback) go
    # before every message's: RabbitMQ's x-max-priority takes an unset priority as 0, the lowest.
    task_default_priority = 9
    # Heartbeats: a dead peer (a half-open TCP connection behind a NAT or a load balancer) is seen within
    # two intervals on either side, and the deliveries it held go back to the queue.
    broker_heartbeat = float(os.environ.get("OPENHUB_BROKER_HEARTBEAT", 30))
    broker_connection_timeout = 10
else:
    broker_transport_options = {"visibility_timeout": visibility_timeout}
    if broker_url.startswith("redis://"):
        broker_transport = (
            "openhub.celery.redisbroker:Transport"  # kombu's Redis transport without a new client per operation
        )

beat_schedule = {
    "openhub-poll": {
        "task": "openhub.poll",
        "schedule": _s.poll_interval.total_seconds(),
        # A tick nobody ran in time is dropped rather than piled up behind a busy worker.
        "options": {"expires": max(_s.poll_interval.total_seconds() * 2, 1.0)},
    },
}
beat_schedule_filename = os.path.join(str(_s.var_dir), "celerybeat-schedule")
os.makedirs(str(_s.var_dir), exist_ok=True)
