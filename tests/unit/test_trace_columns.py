"""The reader's lenient id columns: a stream, device or thread id as a trace writes it, to int64."""

from trainperf.trace.columns import _stream_num, thread_id


def test_a_stream_id_of_every_written_form():
    assert _stream_num(7) == 7
    assert _stream_num(0) == 0
    assert _stream_num(-3) == -3
    assert _stream_num(7.0) == 7
    assert _stream_num("stream 13") == 13
    assert _stream_num("25738") == 25738


def test_a_corrupt_or_absent_id_is_none():
    assert _stream_num(True) == -1  # JSON true is no id, though Python counts it as 1
    assert _stream_num(False) == -1
    assert _stream_num(None) == -1
    assert _stream_num(7.5) == -1
    assert _stream_num("stream") == -1
    assert _stream_num(2**63) == -1  # beyond int64
    assert _stream_num(-(2**63)) == -(2**63)
    assert _stream_num(float("nan")) == -1
    assert _stream_num([1]) == -1
    assert thread_id("MainThread") == -1
    assert thread_id(25738) == 25738
