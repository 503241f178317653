"""Messages of the runner itself, before any protocol's: the settings check of
:func:`fedgrove.runner.run.check_same_settings` and the resume point of :func:`fedgrove.runner.run.agree_resume`."""

from __future__ import annotations

from fedgrove.transport.codec import Message, register


@register
class Settings(Message):
    """A party's federation-wide settings as sorted JSON (``FederationConfig.shared_settings`` and its task)."""

    text: str = ""


@register
class Checkpointed(Message):
    """How many trees a party's newest checkpoint holds (0: none; -1: it takes part in no tree), when every party
    resumes."""

    trees: int = 0
