"""The cycle collector held off while a long thread's state is built: left as it was found."""

import gc

import pytest

from backchannel._collector import collector_paused


def test_the_collector_is_off_in_the_block_and_back_on_after_it_errors_included():
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError), collector_paused():
        raise ValueError("a parse that failed")
    assert gc.isenabled()


def test_a_collector_the_caller_turned_off_stays_off():
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
