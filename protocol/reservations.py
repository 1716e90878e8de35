"""The names of a reservation's states and pending operations (ORCA), as the slice manager records them and
operations (dashboard, metrics, snapshots, accounting) read them. The transitions between them are the slice
manager's own (slice_manager/reservation.py)."""

NASCENT, TICKETED, ACTIVE, ACTIVE_TICKETED, CLOSE_WAIT, CLOSED, FAILED = (
    "Nascent", "Ticketed", "Active", "ActiveTicketed", "CloseWait", "Closed", "Failed")
NONE, TICKETING, REDEEMING, EXTENDING_TICKET, EXTENDING_LEASE, CLOSING, PRIMING = (
    "None", "Ticketing", "Redeeming", "ExtendingTicket", "ExtendingLease", "Closing", "Priming")
STATES = (NASCENT, TICKETED, ACTIVE, ACTIVE_TICKETED, CLOSE_WAIT, CLOSED, FAILED)
PENDING = (NONE, TICKETING, REDEEMING, EXTENDING_TICKET, EXTENDING_LEASE, CLOSING, PRIMING)

HOLDS_TICKET = (TICKETED, ACTIVE, ACTIVE_TICKETED)
HOLDS_LEASE = (ACTIVE, ACTIVE_TICKETED)
