"""The one exception a check raises when a student's answer is wrong (the lowest layer of the judge)."""


class GradingError(AssertionError):
    """A check failed; the message is written for the student."""
