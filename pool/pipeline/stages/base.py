"""What every stage is: ``Stage``, and the sample arithmetic the stages share."""

from pool.backends.base import SPEECH_RATE


class Stage:
    """One step of a unit's chain, run by its own thread (``pool.pipeline.unit``) on its own inbox.

    ``handle(ctx, msg)`` does the work of one message of session ``ctx``; ``end_session()`` is
    called when SESSION_END reaches the stage (forget the session); ``stop()`` when the unit's
    threads are replaced or stopped (release what the stage owns). ``name`` names its inbox and
    thread.
    """

    name = None

    def handle(self, ctx, msg):
        raise NotImplementedError

    def end_session(self):
        pass

    def stop(self):
        pass


def ms(samples):
    """Milliseconds of ``samples`` at 16 kHz (whole ms, rounded down)."""
    return int(samples * 1000 // SPEECH_RATE)
