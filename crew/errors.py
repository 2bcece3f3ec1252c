"""The errors a CREW job raises to its user (``crew.Averager`` and the launch)."""

from __future__ import annotations


class CrewError(Exception):
    """Base of every error CREW raises to the user's training script."""


class LaunchError(CrewError):
    """The job could not start; the message says what is wrong and what to check."""


class SecretError(LaunchError):
    """This rank's secret differs from the coordinator's (or no secret was given)."""


class CoordinatorUnreachable(LaunchError, ConnectionError):
    """No coordinator accepted a connection at the given address within the time allowed."""


class CoordinatorLost(CrewError, ConnectionError):
    """The job's coordinator went away during training and did not come back (in a launched
    job it lives in rank 0's process): the job cannot go on."""


class JoinRefused(LaunchError):
    """The coordinator refused the job or this rank: a different model shape, a missing or
    duplicate rank, a rank that left during start-up."""


class PortError(LaunchError, ValueError):
    """A port setting (``data_port=``, ``CREW_DATA_PORT``, ``CREW_CONTROL_PORT``) is malformed
    or out of range, or no port it allows could be listened on; the message names the setting."""
