"""/api/v1/messages, operators' actions: restart, retry, resubmit or cancel one message
(`/messages/{id}:<action>`), or every one matching filters (`/messages:<action>`); and the answer a waiting
message gets (`/messages/{id}:response`), from an operator or a source system. Each wraps an operator call of
openhub.service.actions, in the hub the app serves."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from openhub.api import body
from openhub.api.auth import Caller, reader
from openhub.api.message_models import (
    ERRORS,
    PAYLOAD_BODY,
    BulkDone,
    Matching,
    MessageId,
    Operating,
    RestartMatching,
    RestartRequest,
    Resubmission,
)
from openhub.api.problems import NO_CONTROL, ApiError
from openhub.api.served import ServedHub, served
from openhub.core.model import Route
from openhub.service import actions as operator
from openhub.service import reads

router = APIRouter(prefix="/api/v1", tags=["messages"])


def _superseded(action: str) -> Any:
    """A dependency of an operator action's old path: the answer names the path that replaces it."""

    def successor(request: Request, response: Response) -> None:
        response.headers["Link"] = (
            f'</api/v1/messages/{request.path_params["message_id"]}:{action}>; rel="successor-version"'
        )

    return Depends(successor)


def _old_path(action: str) -> dict[str, Any]:
    """The options of an operator action's path before issue 40, `/messages/{id}/<action>`: kept working one
    release, for numeric ids only, so that it can never take a route's submission (`order.cancel` is
    `/messages/order/cancel`; a service name starts with a letter)."""
    return dict(
        path=f"/messages/{{message_id:int}}/{action}",
        deprecated=True,
        dependencies=[_superseded(action)],
        operation_id=f"{action}_message_old_path",
        summary=f"Old path of POST /messages/{{id}}:{action}",
    )


# The operator's actions on one message are `/messages/{id}:<action>` (as the bulk ones are `/messages:<action>`):
# one path segment where a route's submission has two, so no route name can ever reach them.
@router.post(
    "/messages/{message_id}:restart",
    responses={s: ERRORS[s] for s in (400, 401, 403, 404, 409, 503)},
    summary="Restart a final message",
)
@router.post(**_old_path("restart"), responses={s: ERRORS[s] for s in (400, 401, 403, 404, 409, 503)})
def restart_message(
    request: Request, message_id: MessageId, _: Operating, hub: ServedHub, options: RestartRequest | None = None
) -> dict[str, Any]:
    """Restart an OK, FAILED or CANCEL message (`total`: make every external call again)."""
    request.state.message_id = message_id
    if options is not None and options.from_step is not None:
        if options.total:
            raise ApiError(400, "give either total or from_step")
        return operator.restart_from(message_id, options.from_step, hub=hub).as_dict()
    return operator.restart(message_id, total=bool(options and options.total), hub=hub).as_dict()


@router.post(
    "/messages/{message_id}:retry",
    responses={s: ERRORS[s] for s in (400, 401, 403, 404, 409, 503)},
    summary="Retry a PARTLY_FAILED or POSTPONED message now",
)
def retry_message(request: Request, message_id: MessageId, _: Operating, hub: ServedHub) -> dict[str, Any]:
    """The message is due at once instead of after its back-off; its failure count is left as it is."""
    request.state.message_id = message_id
    return operator.retry_now(message_id, hub=hub).as_dict()


@router.post(
    "/messages/{message_id}:resubmit",
    responses={s: ERRORS[s] for s in (400, 401, 403, 404, 409, 413, 503)},
    summary="Replace a FAILED message's payload and restart it",
)
def resubmit_message(
    request: Request, message_id: MessageId, _: Operating, hub: ServedHub, resubmission: Resubmission
) -> dict[str, Any]:
    """The new payload is checked as a submission's is; the old one is kept in the history; the message is
    restarted from the step that failed."""
    request.state.message_id = message_id
    return operator.edit_payload(message_id, resubmission.payload, hub=hub).as_dict()


@router.post(
    "/messages/{message_id}:cancel",
    responses={s: ERRORS[s] for s in (400, 401, 403, 404, 409, 503)},
    summary="Cancel a message that is not final yet",
)
@router.post(**_old_path("cancel"), responses={s: ERRORS[s] for s in (400, 401, 403, 404, 409, 503)})
def cancel_message(request: Request, message_id: MessageId, _: Operating, hub: ServedHub) -> dict[str, Any]:
    """Cancel a non-final message; it is confirmed as CANCEL."""
    request.state.message_id = message_id
    return operator.cancel(message_id, hub=hub).as_dict()


_BULK_ERRORS = {s: ERRORS[s] for s in (400, 401, 403, 404, 503)}


@router.post(
    "/messages:restart",
    response_model=BulkDone,
    responses=_BULK_ERRORS,
    summary="Restart the final messages matching filters",
)
def restart_matching(matching: RestartMatching, _: Operating, hub: ServedHub) -> dict[str, Any]:
    """Restart every OK, FAILED or CANCEL message matching the filters (up to `limit`, oldest first)."""
    return operator.restart_matching(total=matching.total, hub=hub, **matching.filters(hub.registry)).as_dict()


@router.post(
    "/messages:cancel",
    response_model=BulkDone,
    responses=_BULK_ERRORS,
    summary="Cancel the live messages matching filters",
)
def cancel_matching(matching: Matching, _: Operating, hub: ServedHub) -> dict[str, Any]:
    """Cancel every message not final yet matching the filters (up to `limit`, oldest first)."""
    return operator.cancel_matching(hub=hub, **matching.filters(hub.registry)).as_dict()


@router.post(
    "/messages/{message_id}:response",
    openapi_extra=PAYLOAD_BODY,
    responses={s: ERRORS[s] for s in (400, 401, 403, 404, 409, 413, 415, 503)},
    summary="Deliver the response a WAITING_FOR_RES message waits for",
)
@router.post(
    **_old_path("response"),
    openapi_extra=PAYLOAD_BODY,
    responses={s: ERRORS[s] for s in (400, 401, 403, 404, 409, 413, 415, 503)},
)
async def respond_message(
    request: Request,
    message_id: MessageId,
    caller: Annotated[Caller, Depends(reader)],
    token: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=64,
            json_schema_extra=NO_CONTROL,
            description="The wait this answers: the `ctx.wait_token` of the step that asked "
            "(`ctx.response_url(...)` carries it).",
        ),
    ] = None,
) -> dict[str, Any]:
    """Resume a message parked by `ctx.wait_for_response`: the admin token, the route's `responders`, or where it
    names none the message's own source system.

    With `token`, the answer is taken for that wait only (also while its question is still being asked); the
    same token again answers 200 with `"duplicate": true` and is not kept; a token of a wait that has ended
    answers 409. Without one, the answer is taken only while the message waits and none was ever taken for
    it (otherwise 409: a token is needed)."""
    request.state.message_id = message_id
    mime, charset = body.media_type(request)
    data = await body.read_limited(request, served(request).settings.max_payload_bytes)
    payload = await run_in_threadpool(body.decode_payload, data, mime, charset)

    if caller.admin and not caller.may("operator"):
        raise ApiError(
            403, f"answering for a message needs the role operator; the token {caller.name!r} is a {caller.role}"
        )

    hub = served(request)

    def deliver() -> dict[str, Any]:
        message = reads.get_message(message_id, hub=hub)
        route = hub.registry.route(message.route)
        refused = may_respond(route, message.source_system, caller)
        if refused == 404:
            raise ApiError(404, f"no message with id {message_id}")  # do not reveal other systems' ids
        if refused == 403:
            whom = ", ".join(route.responders)
            raise ApiError(
                403, f"{caller.source_system} may not answer {route.name}'s callbacks; its responders are {whom}"
            )
        by = caller.source_system or caller.name or "admin"
        return operator.respond(message_id, payload, token=token, by=by, hub=hub).as_dict()

    return await run_in_threadpool(deliver)


def may_respond(route: Route, owner: str, caller: Caller) -> int | None:
    """Whether `caller` may answer a message of `route` submitted by `owner`: None if so, else the
    status to refuse with (404 where the caller may not even see the message, 403 where it may).

    The admin token always may. A route that names its `responders=` (the third party that answers,
    e.g. a bank) takes an answer from those only, so the system that asked cannot answer its own
    third-party callback (issue 27); a route that names none takes it from the message's own source
    system, as before responders could be named.
    """
    if caller.admin or caller.source_system in route.responders:
        return None
    if not route.responders and caller.source_system == owner:
        return None
    return 403 if caller.source_system == owner else 404
