"""Messages of the runner itself, before any protocol's: the settings check of
:func:`fedgrove.runner.run.check_same_settings`."""

from __future__ import annotations

from fedgrove.transport.codec import Message, register


@register
class Settings(Message):
    """A party's federation-wide settings as sorted JSON (``FederationConfig.shared_settings`` and its task)."""

    text: str = ""
