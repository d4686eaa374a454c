"""The route the deploy smoke test sends through the Procfile's processes: one step, no network."""

from openhub import Route, StepContext, step


@step
def ping(ctx: StepContext) -> None:
    """Answer without calling anything, so the smoke test checks only the hub's own plumbing."""
    ctx.custom_data["pong"] = ctx.payload.get("ping", True)


routes = [Route("smoke.ping", steps=[ping])]
