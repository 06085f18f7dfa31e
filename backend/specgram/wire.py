"""The words a response carries on the wire: finish reasons and error kinds (str-valued enums)."""

from __future__ import annotations

from enum import Enum

from .drafting import names, registry


class WireEnum(str, Enum):
    """A str-valued enum: members compare, hash, print and format as their wire strings."""

    __str__ = str.__str__
    __format__ = str.__format__


def draft_sources() -> tuple[str, ...]:
    """Where a draft token came from (spec_detail's sources, the metrics' labels): the grammar forced it, or a
    drafter's own tags (drafting/registry.py: n-gram lookup's prompt / output / guide, the suffix store, the draft
    models, and any drafter registered since), as declared now."""
    return registry.sources()


# a tree's branch drafts (speculation/trees.py): a drafter's runner-up token, another lookup continuation
BRANCH_SOURCES = (names.ALT, names.BRANCH)


class FinishReason(WireEnum):
    """The `finish_reason` output of a final response (and the label of the requests metric)."""

    STOP = "stop"  # EOS, a stop string, or the request's grammar completed
    LENGTH = "length"  # max_tokens or the context limit
    CANCELLED = "cancelled"  # the client cancelled, or the server is shutting down
    TIMEOUT = "timeout"  # request_timeout_s or the request's own timeout passed while it ran
    ERROR = "error"  # the request failed (RequestOutput.error says why)


class ErrorKind(WireEnum):
    INVALID = "invalid"  # the request's fault (e.g. its grammar): INVALID_ARG
    INTERNAL = "internal"  # a failure inside a forward, or the engine stopped: INTERNAL
    UNAVAILABLE = "unavailable"  # not taken on: the server is at capacity or shutting down: UNAVAILABLE
