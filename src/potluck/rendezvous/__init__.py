"""Rendezvous: who is in the cohort, generation by generation.

``StoreRendezvous`` runs the protocol on the job's store (join, admit at a step boundary,
next generation after a failure, graceful leave); ``state`` holds the pure transitions
it is built on; ``admission`` the token challenge-response; ``heartbeat`` the liveness.
"""

from potluck.rendezvous.membership import (
    Membership,
    RendezvousConfig,
    RendezvousEvent,
)
from potluck.rendezvous.state import Action, Decision, Generation, admit, decide, leave, survivors
from potluck.rendezvous.store_rendezvous import StoreRendezvous

__all__ = [
    "Action",
    "Decision",
    "Generation",
    "Membership",
    "RendezvousConfig",
    "RendezvousEvent",
    "StoreRendezvous",
    "admit",
    "decide",
    "leave",
    "survivors",
]
