"""The public surface: __all__ is complete, a broken environment gets a clear error."""

from __future__ import annotations

import pytest

import toolfleet
from toolfleet import BrokerUnavailable, Dispatcher, Settings


def test_all_names_exist_and_public_names_are_exported():
    for name in toolfleet.__all__:
        assert hasattr(toolfleet, name), name
    public = {n for n in vars(toolfleet) if not n.startswith("_") and n[0].isupper()}
    assert public <= set(toolfleet.__all__)


def test_no_redis_gets_a_message_naming_the_url_and_how_to_start_one():
    url = "redis://127.0.0.1:1/0"
    with pytest.raises(BrokerUnavailable) as info:
        Dispatcher(Settings(redis_url=url))
    assert url in str(info.value) and "toolfleet up" in str(info.value)
