"""An order split into one child message per line (the splitter).

`order.create` checks the order, splits it into `order.bookLine` children (dispatched in line
order on the first attempt), waits in WAITING until every line is booked, then notifies the
warehouse. Lines of one SKU go through a funnel with guaranteed order, so stock bookings of one
SKU never run at the same time and are applied in the order the shop sent them.
"""

from __future__ import annotations

from datetime import timedelta

import httpx

from openhub import Child, Reject, Route, Split, StepContext, step

from .customers import EXTERNAL


@step
def check_order(ctx: StepContext) -> None:
    """Refuse an order without lines for good (FAILED, listed as a dead letter)."""
    if not ctx.payload.get("lines"):
        raise Reject("an order needs at least one line", code="E100")


def order_lines(ctx: StepContext) -> list[Child]:
    """One child per order line, funnelled by SKU."""
    return [
        Child("order.bookLine", payload={"order": ctx.payload["orderId"], **line}, object_id=str(line["sku"]))
        for line in ctx.payload["lines"]
    ]


@step
def book_line(ctx: StepContext) -> None:
    """Book the line's stock in the warehouse system."""
    httpx.post(
        f"{EXTERNAL}/warehouse/bookings", json=ctx.payload, headers={"Idempotency-Key": ctx.idempotency_key}, timeout=10
    ).raise_for_status()


@step
def notify_warehouse(ctx: StepContext) -> None:
    """Runs once every line is booked."""
    httpx.post(
        f"{EXTERNAL}/warehouse/orders",
        json={"order": ctx.payload["orderId"]},
        headers={"Idempotency-Key": ctx.idempotency_key},
        timeout=10,
    ).raise_for_status()


routes = [
    Route(
        "order.create",
        steps=[check_order, Split(order_lines, route="order.bookLine"), notify_warehouse],
        object_id=lambda p: p.get("orderId"),
        sources=["CRM", "SHOP"],
        errors={"E100": "the order has no lines"},
    ),
    Route(
        "order.bookLine",
        steps=[book_line],
        funnel=lambda p: str(p["sku"]),
        guaranteed_order=True,
        order_timeout=timedelta(hours=1),
        sources=["CRM", "SHOP"],
    ),  # split children pass as their parent's
]
